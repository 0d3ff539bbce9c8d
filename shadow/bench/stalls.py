"""Moments when the whole machine stood still, seen by a heartbeat process.

A latency benchmark on a shared VM meets stalls that are nobody's code: the host takes the
virtual CPUs away (steal time) and every process stops at once. In `shadow bench tap`'s
raw stamps, 14 times in 10 s nothing was written or read by any process for 0.2-0.8 s,
and every chunk in flight then took that long on both paths, so the P99 of a 1 ms target
measured the host. The heartbeat is a process of its own at a high priority (root may
raise it; otherwise it runs as started) that wakes every `PERIOD_S` and records each gap
longer than `STALL_S` between two of its wake-ups: while it could not run, nothing else
on the machine could have either, or not for a reason a benchmark of our code should
count. A measured interval that overlaps such a gap is left out and counted, on every
path alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: how often the heartbeat wakes
PERIOD_S = 0.0005
#: a gap between two wake-ups longer than this is a stall
STALL_S = 0.005
#: the heartbeat's niceness when it may set it (root)
HEARTBEAT_NICE = -10


def heartbeat_main(out: str) -> None:
    """Wake every PERIOD_S until SIGTERM; write the stalls ([start, end] on the monotonic
    clock, `time.perf_counter`) to `out` as JSON."""
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, HEARTBEAT_NICE)
    stalls: list[tuple[float, float]] = []
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    clock, sleep = time.perf_counter, time.sleep
    last = clock()
    while running:
        sleep(PERIOD_S)
        now = clock()
        if now - last > STALL_S:
            stalls.append((last, now))
        last = now
    Path(out).write_text(json.dumps(stalls))


class Heartbeat:
    """The heartbeat as a child process: `start`, then `stop` returns the stalls seen."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Heartbeat:
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from shadow.bench.stalls import heartbeat_main; "
             "heartbeat_main(sys.argv[1])", str(self.out)],
        )  # fmt: skip
        return self

    def stop(self) -> np.ndarray:
        """The stalls, shape (n, 2): start and end (s, perf_counter)."""
        if self.process is None:
            return np.empty((0, 2))
        self.process.terminate()
        self.process.wait(timeout=30)
        self.process = None
        stalls = json.loads(self.out.read_text()) if self.out.exists() else []
        return np.array(stalls, dtype=float).reshape(-1, 2)


def overlaps_stall(starts: np.ndarray, ends: np.ndarray, stalls: np.ndarray) -> np.ndarray:
    """Per interval [start, end]: whether a stall overlaps it."""
    if not len(stalls) or not len(starts):
        return np.zeros(len(starts), dtype=bool)
    order = np.argsort(stalls[:, 0])
    stall_starts, stall_ends = stalls[order, 0], stalls[order, 1]
    # the stalls are disjoint and in time order: the last one starting before an
    # interval's end is the only candidate (an earlier one ends before it starts)
    k = np.searchsorted(stall_starts, ends, side="left") - 1
    candidate = np.clip(k, 0, len(stall_starts) - 1)
    return (k >= 0) & (stall_ends[candidate] > starts)
