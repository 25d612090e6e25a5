"""PB_COMPILE_LEVEL: torch.compile for the batching engine's forward, chosen at server start.

Upstream's continuous batching can compile its varlen and decode paths
(`ContinuousBatchingConfig.default_compile_level`: 1 = default mode with dynamic shapes,
2 = max-autotune without CUDA graphs, 3 = the same with static shapes), but `transformers
serve` has no flag for it. The knob sets that level when the server's config leaves it at 0.
Compiled code fuses the small elementwise kernels of a step (norms, rotary, activations,
routing); under CUDA graphs each graph then replays the compiled kernels.

Paged attention is excluded from compilation, so dynamo compiles the rest of each attention
call as a frame of its own, specialised on the layer's `layer_idx`: one entry per layer, and
more per shape class. dynamo's default recompile limit (8 entries a frame) is smaller than
the model's layer count, so past it the remaining layers ran uncompiled, and the engine kept
hitting the limit while it served. The knob raises the limits to what the layer count needs.
dynamo keeps user settings per thread, and the engine compiles in its batching thread (and in
the caller's for `generate_batch`'s warm-up), so the limits are set in each thread that calls
the compiled forward, on its first call.
"""

import sys
import threading
import time

from .. import knobs

_thread = threading.local()


def apply(cb_config) -> None:
    level = knobs.get("PB_COMPILE_LEVEL")
    if level and not cb_config.default_compile_level:
        cb_config.default_compile_level = level


def limits(layers: int) -> tuple[int, int]:
    """dynamo's (per-frame, all-frames) recompile limits for a model of `layers` layers: four
    entries a layer (decode and varlen paths, each with a size-1 specialisation) plus room."""
    return 4 * layers + 8, max(256, 16 * layers)


def per_thread_limits(compiled):
    """The compiled forward, raising dynamo's recompile limits for the calling thread on its
    first call (the knob on); upstream's compiled function as it is otherwise."""
    if not knobs.get("PB_COMPILE_LEVEL"):
        return compiled

    def forward(model, *args, **kwargs):
        if not getattr(_thread, "raised", False):
            import torch._dynamo

            per_frame, total = limits(model.config.get_text_config().num_hidden_layers)
            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, per_frame)
            config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, total)
            _thread.raised = True
        return compiled(model, *args, **kwargs)

    return forward


def warm_up(manager, batch_processor) -> None:
    """In the batching thread, before the first batch: with the knob on, a manager nobody warmed
    up (`transformers serve` never does; `generate_batch` does by default) runs upstream's own
    warm-up now, so the first requests do not wait for its compile. On the H200 (W08) that
    warm-up compiled the largest varlen batch only: decode batch shapes still compile when first
    seen."""
    if not knobs.get("PB_COMPILE_LEVEL") or manager.warmed_up:
        return
    start = time.perf_counter()
    batch_processor.warmup(manager.model)
    manager.warmed_up = True
    sys.stderr.write(f"patchbay: compile level {knobs.get('PB_COMPILE_LEVEL')}: upstream's warm-up ran "
                     f"before the first batch ({time.perf_counter() - start:.1f} s)\n")
