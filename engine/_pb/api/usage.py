"""Usage details of replies on patchbay's reply path: how many prompt tokens were served
from the prefix cache (`prompt_tokens_details.cached_tokens`).

The scheduler reports each prefix match; only requests the reply path watches are kept,
so with the path unused nothing is recorded. Every match also counts in PB_METRICS'
pb_prefix_cache_hit_tokens_total (nothing without that knob).
"""

import threading

from . import metrics

_cached: dict = {}
_lock = threading.Lock()


def watch(request_id: str) -> None:
    with _lock:
        _cached[request_id] = 0


def record_cached(request_id: str, tokens: int) -> None:
    """Scheduler hook: `tokens` prompt tokens of the request were found in the cache."""
    metrics.count_cached(tokens)
    with _lock:
        if request_id in _cached:
            _cached[request_id] += int(tokens)


def cached(request_id: str) -> int:
    with _lock:
        return _cached.get(request_id, 0)


def release(request_id: str) -> None:
    with _lock:
        _cached.pop(request_id, None)
