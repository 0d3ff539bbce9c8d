"""How fast this host runs Python right now: a fixed pure-Python workload, timed in CPU
time of the calling thread.

On a shared VM the same code can take a third more CPU time in one minute than in
another (a neighbour's load, without steal time to show for it). A load test that falls
behind needs this to tell the host slowing down from the service slowing down: when the
probe and the service's CPU per event rise together, it was the host.
"""

from __future__ import annotations

import time

#: iterations of the probe's loop: ~3-4 ms on this project's VM, so sampling it every few
#: seconds costs the load test nothing it would notice
PROBE_ITERATIONS = 50_000


def probe_us(iterations: int = PROBE_ITERATIONS) -> float:
    """CPU microseconds this thread took for the fixed workload (lower is faster)."""
    started = time.thread_time()
    total = 0
    for value in range(iterations):
        total += value * value % 7
    elapsed = time.thread_time() - started
    if total < 0:  # never: keeps the loop from being optimised away by a smarter runtime
        raise AssertionError
    return elapsed * 1e6
