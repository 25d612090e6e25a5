"""Timing hooks for the engine (only when HOSTPROF_LOG is set): wall and thread-CPU ms per call."""
import os
LOG = os.environ.get("HOSTPROF_LOG")
if LOG:
    import functools, importlib.abc, importlib.util, inspect, sys, threading, time
    _out = open(LOG, "a", buffering=1)
    _lock = threading.Lock()
    _depth = threading.local()
    TARGETS = {
        "transformers.tokenization_utils_base": ["PreTrainedTokenizerBase.apply_chat_template",
            "PreTrainedTokenizerBase.__call__", "PreTrainedTokenizerBase.encode", "PreTrainedTokenizerBase.decode"],
        "transformers.tokenization_utils_tokenizers": ["TokenizersBackend._encode_plus", "TokenizersBackend._decode",
            "TokenizersBackend._convert_encoding"],
        "transformers.utils.chat_template_utils": ["render_jinja_template"],
        "transformers.cli.serving.chat_completion": ["ChatCompletionHandler.handle_request",
            "ChatCompletionHandler._validate_request", "ChatCompletionHandler._resolve_model",
            "ChatCompletionHandler._build_generation_config"],
        "transformers.cli.serving.utils": ["BaseHandler._validate_request", "BaseHandler._resolve_model",
            "build_response_parser", "GenerationState.get_manager", "CBGenerateManager.init_cb"],
        "transformers.cli.serving.server": [],
        "transformers._pb.context": ["enforce"],
        "transformers._pb.async_io": ["transfer_used", "build_mask"],
        "transformers._pb.messages": ["processor_inputs", "take_thinking_fields"],
        "transformers._pb.knobs": ["take_request_overrides"],
        "transformers._pb.chat": ["respond", "take_fields", "spec_for", "Reply.__init__", "Reply.take", "_chunk"],
        "transformers._pb.grammar": ["constraint_for", "tool_constraint"],
        "transformers._pb.fingerprint": ["of", "stamp", "stamp_sse", "knob_values", "record"],
        "transformers._pb.usage": ["watch", "release", "cached"],
        "transformers._pb.sampler": ["register", "release"],
        "transformers.generation.continuous_batching.continuous_api": [
            "ContinuousBatchingManager.add_request", "ContinuousBatchingManager.register_result_handler",
            "ContinuousBatchingManager._generation_step", "ContinuousBatchProcessor.prepare_next_batch",
            "ContinuousBatchProcessor.update_batch", "ContinuousBatchProcessor._generation_step",
            "OutputRouter.deliver", "OutputRouter.deliver_batch"],
        "transformers.generation.continuous_batching.model_runner": ["ModelRunner.compute_batch",
            "ModelRunner._forward_process_and_sample", "ModelRunner._sample"],
        "transformers.generation.continuous_batching.scheduler": ["FIFOScheduler.schedule_batch",
            "PrefillFirstScheduler.schedule_batch", "Scheduler.add_waiting_request"],
        "transformers.generation.continuous_batching.input_outputs": [
            "ContinuousBatchingIOs.prepare_batch_tensors", "ContinuousBatchingIOs.prepare_batch_update",
            "ContinuousBatchingIOs.carry_over_tokens", "ContinuousBatchingIOs._reset_static_tensors",
            "ContinuousBatchingIOs._reset_read_and_write_indices",
            "ContinuousBatchingIOs.get_model_kwargs", "ContinuousBatchingIOs._transfer_inputs",
            "ContinuousBatchingAsyncIOs.prepare_batch_tensors"],
        "transformers.generation.continuous_batching.cache": ["PagedAttentionCache.allocate_blocks",
            "PagedAttentionCache.extend_read_and_write_indices", "PagedAttentionCache.search_prefix_match",
            "PagedAttentionCache.mark_shareable_blocks_as_complete", "PagedAttentionCache.free_blocks"],
        "transformers.generation.continuous_batching.requests": ["RequestState.__post_init__",
            "RequestState.to_generation_output", "RequestState.update_and_check_completion"],
        "transformers.models.glm4_moe.modeling_glm4_moe": ["Glm4MoeForCausalLM.forward"],
    }
    def emit(name, wall, cpu):
        _out.write(f"{time.time():.6f}\t{threading.current_thread().name}\t{name}\t{wall*1000:.4f}\t{cpu*1000:.4f}\t{getattr(_depth,'d',0)}\n")
    def wrap(name, fn):
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def aw(*a, **k):
                t0 = time.perf_counter()
                try:
                    return await fn(*a, **k)
                finally:
                    emit(name, time.perf_counter() - t0, float("nan"))
            return aw
        if inspect.isasyncgenfunction(fn) or isinstance(fn, (staticmethod, classmethod, property)):
            return fn
        @functools.wraps(fn)
        def w(*a, **k):
            t0 = time.perf_counter(); c0 = time.thread_time()
            _depth.d = getattr(_depth, "d", 0) + 1
            try:
                return fn(*a, **k)
            finally:
                _depth.d -= 1
                emit(name, time.perf_counter() - t0, time.thread_time() - c0)
        return w
    def patch(mod):
        for spec in TARGETS.get(mod.__name__, []):
            parts = spec.split(".")
            owner = mod
            for p in parts[:-1]:
                owner = getattr(owner, p, None)
            if owner is None: continue
            raw = owner.__dict__.get(parts[-1]) if isinstance(owner, type) else getattr(owner, parts[-1], None)
            if raw is None: continue
            setattr(owner, parts[-1], wrap(f"{mod.__name__.split('.')[-1]}.{spec}", raw))
    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in TARGETS: return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None: return None
            orig = spec.loader.exec_module
            def exec_module(module, orig=orig):
                orig(module); patch(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Finder())

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
