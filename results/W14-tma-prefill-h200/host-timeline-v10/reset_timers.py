"""Appended to results/W10-host-prep-h200/host-reset-timeline/timing_hook.py for host-timeline-v10
(the file ran as sitecustomize.py): timers inside _reset_static_tensors, logged as RESET lines."""

if LOG:
    # v9: the per-statement cost of _reset_static_tensors (a copy of the engine's body with timers)
    def _instrument_reset(mod):
        import time as _t, torch as _torch
        from transformers._pb import async_io as _aio
        cls = mod.ContinuousBatchingIOs
        def _reset(self, full_reset=False):
            t = [_t.perf_counter()]
            q_len = self.write_index_storage.size(-1) if full_reset else self.num_q_tokens
            kv_len = self.read_index_storage.size(-1) if full_reset else self.max_kv_read
            b_size = self.max_requests_per_batch + 1 if full_reset else min(self.num_q_tokens, self.max_requests_per_batch)
            self._bulk_input_tensor[: self.static_inputs, : q_len + 1].zero_()
            if full_reset:
                self._bulk_input_tensor[self.static_inputs :] = self.logits_processors_defaults
            self.max_length_q = 0
            t.append(_t.perf_counter())
            self.logits_indices[:b_size].zero_()
            self.output_ids[:, :b_size].zero_()
            t.append(_t.perf_counter())
            masked = False
            for layer_type in self.cumulative_seqlens_k:
                self.max_length_k[layer_type] = 0
                self.total_seqlen_k[layer_type] = 0
                if self.attention_mask is not None and not _aio.mask_on_device(self):
                    masked = True
                    self.attention_mask[layer_type][:, :, :q_len, : q_len + kv_len].fill_(_torch.finfo(self.model_dtype).min)
            t.append(_t.perf_counter())
            if full_reset:
                self.block_table[:, :b_size].fill_(-1)
                self._reset_read_and_write_indices(q_len, kv_len)
            elif self.use_block_table:
                self.block_table[:, :b_size].fill_(-1)
            else:
                self._reset_read_and_write_indices(q_len, kv_len)
            t.append(_t.perf_counter())
            parts = " ".join(f"{(b - a) * 1000:.3f}" for a, b in zip(t, t[1:]))
            emit(f"RESET dev={self.device} q={q_len} kv={kv_len} b={b_size} full={full_reset} masked={masked} "
                 f"bulk={tuple(self._bulk_input_tensor.shape)} parts[bulk,logits,mask,indices]={parts}",
                 t[-1] - t[0], float("nan"))
        cls._reset_static_tensors = _reset
    _orig_patch = patch
    def patch(mod):  # noqa: F811
        _orig_patch(mod)
        if mod.__name__ == "transformers.generation.continuous_batching.input_outputs":
            _instrument_reset(mod)
