"""Per-worker KV-load paths, bucketed in time: what the compare view draws.

A window's replay has one load per worker per step; the UI needs the shape, not every
step, and a day of windows must stay small in the database. So each window keeps at most
`TRAJECTORY_POINTS` buckets per policy: the mean load of every worker over the steps that
start in the bucket, and the bucket means of the imbalance (`max L - min L`), the gap
(`G max L - sum L`) and the step time, which are computed per step before averaging (the
imbalance of mean loads would understate it). Arrays travel as float32 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TRAJECTORY_POINTS = 120
FIELDS = ("t_ms", "loads", "imbalance", "gap", "step_ms")


@dataclass(frozen=True)
class Trajectory:
    """Bucketed path: `t_ms` (P,) bucket times (mean step start, ms from the window start),
    `loads` (P, G) mean load per worker, and per-bucket means of imbalance, gap, step ms."""

    t_ms: np.ndarray
    loads: np.ndarray
    imbalance: np.ndarray
    gap: np.ndarray
    step_ms: np.ndarray

    @property
    def points(self) -> int:
        return int(self.t_ms.shape[0])

    @property
    def workers(self) -> int:
        return int(self.loads.shape[1]) if self.loads.ndim == 2 else 0

    def encode(self) -> dict[str, bytes | int]:
        """Column values for storage: float32 little-endian bytes plus the shape."""
        out: dict[str, bytes | int] = {"points": self.points, "workers": self.workers}
        for name in FIELDS:
            out[name] = np.ascontiguousarray(getattr(self, name), dtype="<f4").tobytes()
        return out

    @classmethod
    def decode(cls, row: dict) -> Trajectory:
        points, workers = int(row["points"]), int(row["workers"])

        def arr(name: str) -> np.ndarray:
            return np.frombuffer(row[name], dtype="<f4").astype(np.float64)

        return cls(
            arr("t_ms"),
            arr("loads").reshape(points, workers),
            arr("imbalance"),
            arr("gap"),
            arr("step_ms"),
        )


def bucket(
    start_ms: np.ndarray,
    duration_ms: np.ndarray,
    loads: np.ndarray,
    span_ms: float,
    points: int = TRAJECTORY_POINTS,
) -> Trajectory:
    """Mean of each quantity over the steps starting in each of `points` equal time
    buckets of `[0, span_ms)`; empty buckets are dropped."""
    start_ms = np.asarray(start_ms, dtype=np.float64)
    loads = np.asarray(loads, dtype=np.float64)
    workers = loads.shape[1] if loads.ndim == 2 else 0
    if start_ms.size == 0 or span_ms <= 0 or workers == 0:
        empty = np.empty(0)
        return Trajectory(empty, np.empty((0, workers)), empty, empty, empty)
    index = np.clip((start_ms / span_ms * points).astype(np.int64), 0, points - 1)
    counts = np.bincount(index, minlength=points).astype(np.float64)
    keep = counts > 0

    def mean(values: np.ndarray) -> np.ndarray:
        return (np.bincount(index, weights=values, minlength=points) / np.maximum(counts, 1))[keep]

    top, bottom = loads.max(axis=1), loads.min(axis=1)
    per_worker = np.stack([mean(loads[:, g]) for g in range(workers)], axis=1)
    return Trajectory(
        mean(start_ms),
        per_worker,
        mean(top - bottom),
        mean(workers * top - loads.sum(axis=1)),
        mean(np.asarray(duration_ms, dtype=np.float64)),
    )


def join(parts: Sequence[tuple[float, Trajectory]], points: int) -> Trajectory:
    """Windows laid end to end (`(t_start_s, trajectory)`, times made absolute in
    seconds), re-bucketed by equal point counts to at most `points`."""
    parts = [(t0, tr) for t0, tr in parts if tr.points]
    if not parts:
        empty = np.empty(0)
        return Trajectory(empty, np.empty((0, 0)), empty, empty, empty)
    t = np.concatenate([t0 + tr.t_ms / 1000.0 for t0, tr in parts])
    loads = np.concatenate([tr.loads for _, tr in parts])
    imbalance = np.concatenate([tr.imbalance for _, tr in parts])
    gap = np.concatenate([tr.gap for _, tr in parts])
    step = np.concatenate([tr.step_ms for _, tr in parts])
    order = np.argsort(t, kind="stable")
    t, loads, imbalance = t[order], loads[order], imbalance[order]
    gap, step = gap[order], step[order]
    if t.shape[0] <= points:
        return Trajectory(t, loads, imbalance, gap, step)
    groups = np.arange(t.shape[0]) * points // t.shape[0]
    counts = np.bincount(groups).astype(np.float64)

    def mean(values: np.ndarray) -> np.ndarray:
        return np.bincount(groups, weights=values) / counts

    return Trajectory(
        mean(t),
        np.stack([mean(loads[:, g]) for g in range(loads.shape[1])], axis=1),
        mean(imbalance),
        mean(gap),
        mean(step),
    )
