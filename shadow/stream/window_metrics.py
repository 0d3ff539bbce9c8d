"""The window metrics (one list), measured the same way on a replay and on what the
fleet did: `span_metrics` over the steps that start inside a window, `tpot_inside` per
request that decoded there, and `observed_window`, which reads the observed fleet's steps
(keyed per worker, lined up by time) into those metrics and a trajectory."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shadow.stream.trajectory import Trajectory, bucket

WINDOW_METRICS = (
    "imbalance_mean",
    "gap_mean",
    "step_ms_mean",
    "throughput_tok_s",
    "tpot_p95_ms",
    "pool_wait_p95_ms",
    "steps",
    "busy_s",
)


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def span_metrics(
    starts: np.ndarray,
    durations: np.ndarray,
    loads: np.ndarray,
    running: np.ndarray,
    span_s: float,
    tpot: np.ndarray,
    wait: np.ndarray,
) -> dict[str, float]:
    if loads.size:
        top, bottom = loads.max(axis=1), loads.min(axis=1)
        imbalance = float((top - bottom).mean())
        gap = float((loads.shape[1] * top - loads.sum(axis=1)).mean())
        step = float(durations.mean())
    else:
        imbalance = gap = step = math.nan
    return {
        "imbalance_mean": imbalance,
        "gap_mean": gap,
        "step_ms_mean": step,
        "throughput_tok_s": float(running.sum()) / span_s if span_s > 0 else math.nan,
        "tpot_p95_ms": _percentile(tpot, 95),
        "pool_wait_p95_ms": _percentile(wait, 95),
        "steps": float(starts.shape[0]),
        # the time the throughput is over: the span (a continuous run's is its busy time)
        "busy_s": span_s,
    }


def tpot_inside(ends: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per request, mean ms per token between its first and last step inside the window
    (`first`/`last` index `ends`; requests with fewer than two steps there are skipped)."""
    keep = (last - first >= 1) & (first >= 0) & (last < ends.shape[0])
    if not keep.any():
        return np.empty(0)
    return (ends[last[keep]] - ends[first[keep]]) / (last[keep] - first[keep])


#: a worker's step as the window tracker keeps it while steps can still come:
#: (worker index, its own step number) -> (start s, duration ms, kv tokens, running)
StepMap = Mapping[tuple[int, int], tuple[float, float, int, int]]


@dataclass(frozen=True)
class SealedSteps:
    """A window's steps once no more can come, as columns in `observed_window`'s order
    (start, worker, duration, kv, running; those that start inside the window only).

    A window waits minutes for its requests to finish before it is evaluated (at
    G = 256, 4,300 steps a second, the dict of tuples held ~300 bytes a step: ~40 MiB a
    30 s window, a few of them waiting at once, more while the evaluation lags); the
    columns hold 36 bytes a step, and `observed_window` reads them as they are."""

    start: np.ndarray
    worker: np.ndarray
    duration: np.ndarray
    kv: np.ndarray
    running: np.ndarray

    @classmethod
    def of(cls, steps: StepMap, t_start: float) -> SealedSteps:
        held = _held(steps, t_start)
        return cls(
            np.array([e[0] for e in held], dtype=np.float64),
            np.array([e[1] for e in held], dtype=np.int32),
            np.array([e[2] for e in held], dtype=np.float64),
            np.array([e[3] for e in held], dtype=np.int64),
            np.array([e[4] for e in held], dtype=np.int64),
        )

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.start, self.worker, self.duration, self.kv,
                                      self.running))  # fmt: skip


def _held(steps: StepMap, t_start: float) -> list[tuple[float, int, float, int, int]]:
    """The steps that start inside the window, sorted by start, then worker."""
    return sorted(
        (start, g, duration, kv, running)
        for (g, _), (start, duration, kv, running) in steps.items()
        if start >= t_start - 1e-9
    )


def observed_window(
    steps: StepMap | SealedSteps,
    t_start: float,
    t_end: float,
    workers: int,
    request_ids: Sequence[str],
    queued: Sequence[str],
    requests: Mapping[str, Any],
) -> tuple[dict[str, float], Trajectory]:
    """What the fleet did in the window. A row is a moment some worker started a step
    (workers stepping together share one); its load per worker is the kv of that worker's
    step covering the moment (0: idle), its tokens the running of the steps that start
    there. `steps` is keyed (worker, its own step number); `queued` are the requests that
    were waiting at the start or arrived (a TPOT only once dispatched); or those steps
    sealed (`SealedSteps`), the same result."""
    columns = steps if isinstance(steps, SealedSteps) else SealedSteps.of(steps, t_start)
    first_of_group = _step_groups(columns.start)
    starts = columns.start[first_of_group]
    if first_of_group.size:
        durations = np.maximum.reduceat(columns.duration, first_of_group)
        running = np.add.reduceat(columns.running, first_of_group)
    else:
        durations = np.empty(0)
        running = np.empty(0, dtype=np.int64)
    loads = _covering_loads(columns, first_of_group, starts, workers)
    keep = running > 0  # steps with no active request are not steps
    ends = starts + durations / 1000.0
    dispatched, finished, wait = [], [], []
    started = set(queued)
    for rid in request_ids:
        info = requests.get(rid)
        if info is None or (rid in started and info.dispatch_ts is None):
            continue  # never dispatched: it decoded nothing, so it has no TPOT
        dispatched.append(-math.inf if info.dispatch_ts is None else info.dispatch_ts)
        finished.append(math.inf if info.finish_ts is None else info.finish_ts)
    firsts = starts.searchsorted(np.array(dispatched, dtype=np.float64) - 1e-9, side="left")
    lasts = ends.searchsorted(np.array(finished, dtype=np.float64) + 1e-9, side="right") - 1
    for rid in queued:
        info = requests.get(rid)
        if info is not None and info.dispatch_ts is not None and info.ready_ts is not None:
            wait.append((info.dispatch_ts - max(info.ready_ts, t_start)) * 1000.0)
    tpot = tpot_inside(ends * 1000.0, firsts.astype(np.int64), lasts.astype(np.int64))
    span_s = t_end - t_start
    metrics = span_metrics(
        starts[keep], durations[keep], loads[keep], running[keep], span_s, tpot,
        np.array(wait),
    )  # fmt: skip
    path = bucket((starts[keep] - t_start) * 1000.0, durations[keep], loads[keep], span_s * 1000.0)
    return metrics, path


def _step_groups(start: np.ndarray) -> np.ndarray:
    """Index of the first step of each row: a row is the steps (sorted by start) within
    1e-6 s of the row's first. Rows are found from the gaps between neighbours, which
    decides every row whose steps span at most 1e-6 s (workers stepping together start at
    the same moment); a row spanning more is cut again one step at a time."""
    if not start.size:
        return np.empty(0, dtype=np.int64)
    firsts = np.flatnonzero(np.r_[True, np.diff(start) > 1e-6])
    lasts = np.r_[firsts[1:], start.size] - 1
    if not np.any(start[lasts] - start[firsts] > 1e-6):
        return firsts
    cut = [0]
    for i in range(1, start.size):
        if start[i] - start[cut[-1]] > 1e-6:
            cut.append(i)
    return np.array(cut, dtype=np.int64)


def _covering_loads(
    steps: SealedSteps, first_of_group: np.ndarray, starts: np.ndarray, workers: int
) -> np.ndarray:
    """Per row and worker, the kv of that worker's latest step up to the row when it
    still runs at the row's start (0: idle, or no step yet)."""
    rows = first_of_group.size
    loads = np.zeros((rows, workers), dtype=np.int64)
    if not rows:
        return loads
    opens_row = np.zeros(steps.start.size, dtype=np.int64)
    opens_row[first_of_group] = 1
    row_of = np.cumsum(opens_row) - 1  # each step's row
    everyone = np.arange(rows)
    for g in range(workers):
        mine = np.flatnonzero(steps.worker == g)
        if not mine.size:
            continue
        latest = row_of[mine].searchsorted(everyone, side="right") - 1
        seen = latest >= 0
        step = mine[latest[seen]]
        end = steps.start[step] + steps.duration[step] / 1000.0
        loads[everyone[seen], g] = np.where(end > starts[seen] + 1e-9, steps.kv[step], 0)
    return loads


def encode_tpot(values: np.ndarray | None) -> bytes | None:
    """A window's per-request TPOTs for storage: float32 little-endian (a relative error
    under 1e-7, far inside what the gate resolves; half the bytes of float64)."""
    if values is None:
        return None
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def decode_tpot_array(blob: bytes | None) -> np.ndarray | None:
    """What `encode_tpot` stored, as a float64 array (None: not stored)."""
    if blob is None:
        return None
    return np.frombuffer(blob, dtype="<f4").astype(np.float64)


def decode_tpot(blob: bytes | None) -> tuple[float, ...] | None:
    """What `encode_tpot` stored, as floats (None: not stored)."""
    values = decode_tpot_array(blob)
    return None if values is None else tuple(values.tolist())
