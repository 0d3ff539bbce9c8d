"""The mutable state a replay run steps: the fleet's slots and per-request columns, the
run's growing input columns, and the stretch of steps being committed.

`FleetReplay` (engine.py) is the only writer; policies read the snapshots it builds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class RunningFleet:
    """Mutable fleet state: the only place the replay mutates (the policy only reads).

    Per-request arrays grow as requests are added (a continuous run keeps adding)."""

    def __init__(self, workers: int, batch: int) -> None:
        self.workers = workers
        self.batch = batch
        self.base = np.zeros(workers, dtype=np.int64)  # sum over active of (s_i - admit_step_i)
        self.count = np.zeros(workers, dtype=np.int64)
        self.active = np.empty(0, dtype=np.int64)
        self.worker = np.empty(0, dtype=np.int64)
        self.admit_step = np.empty(0, dtype=np.int64)
        self.finish_step = np.empty(0, dtype=np.int64)
        self.admit_ms = np.empty(0)

    def reserve(self, total: int) -> None:
        """Room for `total` requests (doubling, so appending one at a time stays linear)."""
        have = self.worker.shape[0]
        if total <= have:
            return
        size = max(total, 2 * have)
        for name, fill in (("worker", -1), ("admit_step", -1), ("finish_step", -1)):
            grown = np.full(size, fill, dtype=np.int64)
            grown[:have] = getattr(self, name)
            setattr(self, name, grown)
        admit_ms = np.full(size, np.nan)
        admit_ms[:have] = self.admit_ms
        self.admit_ms = admit_ms

    def admit(self, request: int, g: int, step: int, now_ms: float, prompt: int, output: int):
        self.worker[request] = g
        self.admit_step[request] = step
        self.finish_step[request] = step + output - 1
        self.admit_ms[request] = now_ms
        self.base[g] += prompt - step
        self.count[g] += 1

    def loads(self, step: int) -> np.ndarray:
        return self.base + self.count * step

    def compact(self, keep: np.ndarray) -> None:
        """Keep only the requests `keep` marks (over the first `keep.shape[0]`)."""
        n = keep.shape[0]
        self.worker = self.worker[:n][keep]
        self.admit_step = self.admit_step[:n][keep]
        self.finish_step = self.finish_step[:n][keep]
        self.admit_ms = self.admit_ms[:n][keep]


class GrownColumn:
    """An append-only int64 or float64 column with amortised growth."""

    def __init__(self, dtype: type) -> None:
        self.data = np.empty(64, dtype=dtype)
        self.size = 0

    def extend(self, values: np.ndarray) -> None:
        need = self.size + values.shape[0]
        if need > self.data.shape[0]:
            grown = np.empty(max(need, 2 * self.data.shape[0]), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : need] = values
        self.size = need

    @property
    def view(self) -> np.ndarray:
        return self.data[: self.size]

    def compact(self, keep: np.ndarray) -> None:
        """Keep only the values `keep` marks (it covers the whole column)."""
        kept = self.view[keep]
        self.data = np.empty(max(64, kept.shape[0]), dtype=self.data.dtype)
        self.data[: kept.shape[0]] = kept
        self.size = kept.shape[0]


@dataclass
class Stretch:
    """Steps with a fixed active set, computed whole from `step`; `committed` of them are
    in the run so far."""

    step: int
    now: float
    block: np.ndarray
    durations: np.ndarray
    ends: np.ndarray
    #: each step's start: the stretch's start, then the ends but the last
    starts: np.ndarray
    count: np.ndarray
    #: an arrival can cut it: a slot is free, or the policy dispatches on arrival
    has_free: bool
    committed: int = 0
