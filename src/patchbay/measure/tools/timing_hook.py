"""Where a request's host time goes inside the engine: wall and thread-CPU time of every call of the
engine's request, batching and tokenizer functions (TARGETS), and optionally of each tensor write
made inside chosen functions (OPS_INSIDE). Runs in the server as a sitecustomize hook:

    PYTHONPATH=$(python -m patchbay.measure.tools.hooks site):$PYTHONPATH HOSTPROF_LOG=hook.tsv \
        python3 -m patchbay.device serve ...

Environment (read once, at interpreter start):
    HOSTPROF_LOG=FILE            on; one line per call appended to FILE
    HOSTPROF_RECORD=calls,ops    what to record (default calls): `calls` times the TARGETS;
                                 `ops` also times every zero_/fill_/copy_/__setitem__ on a tensor
                                 while one of OPS_INSIDE runs on that thread
    HOSTPROF_TARGETS=MOD:QUAL,…  more functions to time (`module:Class.method`)
    HOSTPROF_OPS_INSIDE=MOD:QUAL,…  more functions whose tensor writes `ops` times

A line of FILE: end wall-clock time (s), thread, name, wall ms, thread-CPU ms (nan for coroutines),
depth (timed calls enclosing it on its thread). A call's name is the module's last part and the
qualified name (`continuous_api.ContinuousBatchingManager.add_request`); an op's is
`OP <function> <op> shape=… dtype device`. timeline.py reads the calls.

This replaces W09/W10's timing_hook.py (one list: W10's, a superset of W09's) and W14's
reset_timers.py: instead of a copy of _reset_static_tensors' body with timers between its
statements, `ops` times each tensor write the engine's own body makes, with the tensor's shape,
so it keeps up with the engine.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from patchbay.measure.tools import hooks

TARGETS = {
    "transformers.tokenization_utils_base": [
        "PreTrainedTokenizerBase.apply_chat_template", "PreTrainedTokenizerBase.__call__",
        "PreTrainedTokenizerBase.encode", "PreTrainedTokenizerBase.decode"],
    "transformers.tokenization_utils_tokenizers": [
        "TokenizersBackend._encode_plus", "TokenizersBackend._decode", "TokenizersBackend._convert_encoding"],
    "transformers.utils.chat_template_utils": ["render_jinja_template"],
    "transformers.cli.serving.chat_completion": [
        "ChatCompletionHandler.handle_request", "ChatCompletionHandler._validate_request",
        "ChatCompletionHandler._resolve_model", "ChatCompletionHandler._build_generation_config"],
    "transformers.cli.serving.utils": [
        "BaseHandler._validate_request", "BaseHandler._resolve_model", "build_response_parser",
        "GenerationState.get_manager", "CBGenerateManager.init_cb"],
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
    "transformers.generation.continuous_batching.model_runner": [
        "ModelRunner.compute_batch", "ModelRunner._forward_process_and_sample", "ModelRunner._sample"],
    "transformers.generation.continuous_batching.scheduler": [
        "FIFOScheduler.schedule_batch", "PrefillFirstScheduler.schedule_batch", "Scheduler.add_waiting_request"],
    "transformers.generation.continuous_batching.input_outputs": [
        "ContinuousBatchingIOs.prepare_batch_tensors", "ContinuousBatchingIOs.prepare_batch_update",
        "ContinuousBatchingIOs.carry_over_tokens", "ContinuousBatchingIOs._reset_static_tensors",
        "ContinuousBatchingIOs._reset_read_and_write_indices", "ContinuousBatchingIOs.get_model_kwargs",
        "ContinuousBatchingIOs._transfer_inputs", "ContinuousBatchingAsyncIOs.prepare_batch_tensors"],
    "transformers.generation.continuous_batching.cache": [
        "PagedAttentionCache.allocate_blocks", "PagedAttentionCache.extend_read_and_write_indices",
        "PagedAttentionCache.search_prefix_match", "PagedAttentionCache.mark_shareable_blocks_as_complete",
        "PagedAttentionCache.free_blocks"],
    "transformers.generation.continuous_batching.requests": [
        "RequestState.__post_init__", "RequestState.to_generation_output",
        "RequestState.update_and_check_completion"],
    "transformers.models.glm4_moe.modeling_glm4_moe": ["Glm4MoeForCausalLM.forward"],
}
# W14 found the cold prompt's 3-6 ms here (a 57K-element zero_ spread over 16 threads, 0440).
OPS_INSIDE = {"transformers.generation.continuous_batching.input_outputs": ["ContinuousBatchingIOs._reset_static_tensors"]}
TENSOR_OPS = ("zero_", "fill_", "copy_", "__setitem__")
RECORDS = ("calls", "ops")

_inside = threading.local()


def parse_targets(text: str) -> dict[str, list[str]]:
    """`mod.a:Cls.f,mod.a:g,mod.b:h` -> {"mod.a": ["Cls.f", "g"], "mod.b": ["h"]}."""
    out: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        module, sep, qualname = item.partition(":")
        if not sep or not module or not qualname:
            raise ValueError(f"{item!r}: expected module:Qual.name")
        out.setdefault(module, []).append(qualname)
    return out


def merged(*tables: dict[str, list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for table in tables:
        for module, names in table.items():
            out.setdefault(module, []).extend(n for n in names if n not in out.get(module, []))
    return out


def _short(module_name: str, qualname: str) -> str:
    return f"{module_name.rsplit('.', 1)[-1]}.{qualname}"


def install(log_path: str, record=("calls",), targets=None, inside=None) -> None:
    """Time `targets` (default TARGETS) into log_path, and with "ops" in record the tensor writes
    made inside `inside` (default OPS_INSIDE). Each module is patched when it is imported (at once
    if it already is)."""
    unknown = set(record) - set(RECORDS)
    if unknown:
        raise ValueError(f"HOSTPROF_RECORD: {', '.join(sorted(unknown))} (allowed: {', '.join(RECORDS)})")
    log = hooks.Log(log_path)

    def emit(name, wall, cpu, depth):
        log.write(f"{time.time():.6f}", threading.current_thread().name, name, f"{wall * 1000:.4f}",
                  f"{cpu * 1000:.4f}", depth)

    def patch_calls(module, names):
        for qualname in names:
            found = hooks.resolve(module, qualname)
            name = _short(module.__name__, qualname)
            wrapped = found and hooks.timed(found[2], lambda w, c, d, name=name: emit(name, w, c, d))
            if not wrapped:
                hooks.warn(f"timing_hook: {module.__name__}.{qualname} {'not found' if not found else 'not a plain function'}")
                continue
            setattr(found[0], found[1], wrapped)

    def patch_inside(module, names):
        for qualname in names:
            found = hooks.resolve(module, qualname)
            if not found or not callable(found[2]):
                hooks.warn(f"timing_hook: {module.__name__}.{qualname} not found (ops)")
                continue
            setattr(found[0], found[1], _marking(found[2], _short(module.__name__, qualname)))

    if "calls" in record:
        for module_name, names in (TARGETS if targets is None else targets).items():
            hooks.after_import(module_name, lambda m, names=names: patch_calls(m, names))
    if "ops" in record:
        for module_name, names in (OPS_INSIDE if inside is None else inside).items():
            hooks.after_import(module_name, lambda m, names=names: patch_inside(m, names))
        hooks.after_import("torch", lambda torch: _patch_tensor_ops(torch, emit))


def _marking(fn, name):
    """fn that marks its thread as inside `name` while it runs (for the tensor-op timers)."""
    import functools

    @functools.wraps(fn)
    def inside(*args, **kwargs):
        outer = getattr(_inside, "name", None)
        _inside.name = name
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.name = outer
    return inside


def _patch_tensor_ops(torch, emit) -> None:
    for op in TENSOR_OPS:
        raw = getattr(torch.Tensor, op)

        def timed_op(self, *args, _raw=raw, _op=op, **kwargs):
            where = getattr(_inside, "name", None)
            if where is None:
                return _raw(self, *args, **kwargs)
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return _raw(self, *args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                key = f" [{_index(args[0])}]" if _op == "__setitem__" and args else ""
                emit(f"OP {where} {_op}{key} shape={tuple(self.shape)} {str(self.dtype).removeprefix('torch.')} "
                     f"{self.device}", wall, cpu, 0)
        setattr(torch.Tensor, op, timed_op)


def _index(key) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    out = []
    for p in parts:
        if isinstance(p, slice):
            out.append(":".join("" if v is None else str(v) for v in (p.start, p.stop)))
        elif isinstance(p, (int, type(None), type(Ellipsis))):
            out.append(str(p))
        else:
            out.append(type(p).__name__)
    return ", ".join(out)[:80]


def install_from_env(environ=os.environ) -> bool:
    """Install as the environment says (module docstring); False when HOSTPROF_LOG is unset."""
    log = environ.get("HOSTPROF_LOG")
    if not log:
        return False
    record = tuple(filter(None, environ.get("HOSTPROF_RECORD", "calls").split(",")))
    install(log, record, merged(TARGETS, parse_targets(environ.get("HOSTPROF_TARGETS", ""))),
            merged(OPS_INSIDE, parse_targets(environ.get("HOSTPROF_OPS_INSIDE", ""))))
    return True


if __name__ == "__main__":
    print(__doc__, file=sys.stderr)
    sys.exit(2)
