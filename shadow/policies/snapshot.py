"""The plain data a routing policy sees and returns.

A snapshot is columnar (numpy arrays, one row per active request) because every
consumer that runs often (the replay engine, the mirror, the audit) already holds its
state that way, and BR-H projects thousands of active requests per round. Object views
(`WorkerView`, `ActiveRequest`, `ReadyRequest`) exist for callers that build snapshots by
hand, such as tests and the HTTP API.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from shadow.predict.active import NO_KEY, ActiveSet, int_column, prompt_key_id


class Admission(NamedTuple):
    """One routing decision: send `request_id` to `worker`."""

    request_id: Hashable
    worker: Hashable


@dataclass(frozen=True, slots=True)
class ActiveRequest:
    """A request decoding on a worker; `output_tokens` (its true final length) replay only."""

    request_id: Hashable
    prompt_tokens: int
    generated: int
    prompt_key: Hashable | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ReadyRequest:
    """A request whose prefill has finished, waiting in the pool for a decode worker."""

    request_id: Hashable
    prompt_tokens: int
    prompt_key: Hashable | None = None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One decode worker as a router sees it."""

    worker: Hashable
    capacity: int
    active: Sequence[ActiveRequest] = ()
    waiting: int = 0


@dataclass(frozen=True)
class FleetSnapshot:
    """Per-worker capacity, active count, KV load `L_g`, and the active set behind them."""

    worker_ids: Sequence[Hashable]
    capacity: np.ndarray
    active_count: np.ndarray
    load: np.ndarray
    active: ActiveSet
    waiting: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: prompt tokens of the requests queued at each worker (worker queues; zeros otherwise)
    waiting_tokens: np.ndarray | None = None
    #: when the round runs, in ms of the replay's clock (NaN where no clock is kept):
    #: routers that act on periodically published counts (`vllm-dplb`) read it
    now_ms: float = math.nan

    @property
    def workers(self) -> int:
        return len(self.worker_ids)

    @property
    def free_slots(self) -> np.ndarray:
        return np.maximum(self.capacity - self.active_count, 0)

    @classmethod
    def from_active(
        cls,
        capacity: object,
        active: ActiveSet,
        worker_ids: Sequence[Hashable] | None = None,
        waiting: object | None = None,
    ) -> FleetSnapshot:
        """Build a snapshot from the active set; counts and loads are derived, never passed in."""
        capacity_col = int_column("capacity", capacity)
        workers = capacity_col.shape[0]
        if workers == 0:
            raise ValueError("a fleet needs at least one worker")
        if capacity_col.min() < 0:
            raise ValueError("capacity must be >= 0")
        if len(active) and (active.worker.min() < 0 or active.worker.max() >= workers):
            raise ValueError(f"active worker index out of range 0..{workers - 1}")
        ids = tuple(range(workers)) if worker_ids is None else tuple(worker_ids)
        if len(ids) != workers:
            raise ValueError(f"worker_ids has {len(ids)} entries, capacity has {workers}")
        count = np.bincount(active.worker, minlength=workers).astype(np.int64)
        load = np.bincount(
            active.worker, weights=active.prompt_tokens + active.generated, minlength=workers
        ).astype(np.int64)
        waiting_col = (
            np.zeros(workers, dtype=np.int64)
            if waiting is None
            else int_column("waiting", waiting, workers)
        )
        return cls(ids, capacity_col, count, load, active, waiting_col)

    @classmethod
    def from_workers(cls, workers: Sequence[WorkerView]) -> FleetSnapshot:
        """Build a snapshot from object views (tests, API payloads)."""
        rows = [(g, r) for g, view in enumerate(workers) for r in view.active]
        remaining = None
        if rows and all(r.output_tokens is not None for _, r in rows):
            remaining = [r.output_tokens - r.generated for _, r in rows]  # type: ignore[operator]
        active = ActiveSet.from_arrays(
            [g for g, _ in rows],
            [r.prompt_tokens for _, r in rows],
            [r.generated for _, r in rows],
            [prompt_key_id(r.prompt_key) for _, r in rows],
            remaining,
        )
        return cls.from_active(
            [view.capacity for view in workers],
            active,
            worker_ids=[view.worker for view in workers],
            waiting=[view.waiting for view in workers],
        )


@dataclass(frozen=True)
class ReadyPool:
    """The prompt pool in ready order (oldest first)."""

    request_ids: Sequence[Hashable]
    prompt_tokens: np.ndarray
    prompt_keys: np.ndarray

    def __len__(self) -> int:
        return len(self.request_ids)

    @classmethod
    def from_arrays(
        cls,
        request_ids: Sequence[Hashable],
        prompt_tokens: object,
        prompt_keys: object | None = None,
    ) -> ReadyPool:
        n = len(request_ids)
        prompt_col = int_column("prompt_tokens", prompt_tokens, n)
        if n and prompt_col.min() < 0:
            raise ValueError("prompt_tokens must be >= 0")
        keys = (
            np.full(n, NO_KEY, dtype=np.int64)
            if prompt_keys is None
            else int_column("prompt_keys", prompt_keys, n)
        )
        return cls(request_ids, prompt_col, keys)

    @classmethod
    def from_requests(cls, requests: Sequence[ReadyRequest]) -> ReadyPool:
        return cls.from_arrays(
            [r.request_id for r in requests],
            [r.prompt_tokens for r in requests],
            [prompt_key_id(r.prompt_key) for r in requests],
        )
