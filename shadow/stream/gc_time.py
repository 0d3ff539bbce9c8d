"""CPU time the garbage collector took in the calling thread, so that a timed decision
round can leave it out.

Why: the audit times each policy's round in thread CPU time against the decision
timeout (`stream.audit`). A collection that starts inside a round walks the whole
process's heap (the replica mirror, the predictor, the caches), tens of milliseconds at
a large fleet; counted as the round's, it made a 6 ms policy "time out" at 50 ms on a
loaded CI host. A router running the policy does not hold the shadow's heap, so the
collection is the audit process's cost, not the policy's.

The callback runs only at collections (rare: `service.interpreter` sets a high young
threshold), so the rounds pay two dictionary reads for it.
"""

from __future__ import annotations

import gc
import threading
import time

#: per thread: CPU seconds spent in collections so far, and the start of the one running
_spent: dict[int, float] = {}
_started: dict[int, float] = {}


def _on_collection(phase: str, _info: dict[str, int]) -> None:
    thread = threading.get_ident()
    if phase == "start":
        _started[thread] = time.thread_time()
        return
    began = _started.pop(thread, None)
    if began is not None:
        _spent[thread] = _spent.get(thread, 0.0) + time.thread_time() - began


def watch_collections() -> None:
    """Start counting (once per process; a second call does nothing)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def collection_seconds() -> float:
    """CPU seconds the calling thread has spent in collections since `watch_collections`."""
    return _spent.get(threading.get_ident(), 0.0)
