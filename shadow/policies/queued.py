"""The routers that dispatch on arrival into per-worker queues, as deployed routers do.

Each request is sent to a worker the moment it is ready; a full worker keeps it in its own
`waiting` queue and starts it FCFS when one of its slots frees, and it never moves
(`HoldsWork.WORKER_QUEUES`; the replay engine runs the queues). So these rules count what
a real router counts: in-flight requests or bytes, queued ones included, and never check
for a free slot. Rules and sources: docs/POLICIES.md.
"""

from __future__ import annotations

import math
import random as _random
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np

from shadow.policies.base import HoldsWork, Policy
from shadow.policies.fscore import f_score_br0
from shadow.policies.registry import register_policy
from shadow.policies.snapshot import Admission, FleetSnapshot, ReadyPool

#: Bytes of request body per prompt token for `ascend-proxy` (our traces carry tokens, not
#: bodies): about 4 characters of English text per token, as JSON text.
BODY_BYTES_PER_TOKEN = 4
#: Bytes of a completion request's JSON envelope around the prompt (model, sampling
#: parameters, stream flag): the part of the body that does not grow with the prompt.
BODY_ENVELOPE_BYTES = 160


def body_bytes(prompt_tokens: np.ndarray | int) -> np.ndarray | int:
    """The request-body length `ascend-proxy` counts, derived from the prompt length:
    deterministic, so a replay and its rerun route the same."""
    return BODY_BYTES_PER_TOKEN * prompt_tokens + BODY_ENVELOPE_BYTES


@dataclass
class DispatchView:
    """Per-worker counts a dispatching router keeps, updated by its own dispatches within
    the round (a dispatched request is queued at its worker until the engine starts it)."""

    running: list[int]
    waiting: list[int]
    running_tokens: list[int]
    waiting_tokens: list[int]
    capacity: list[int]

    @classmethod
    def of(cls, snapshot: FleetSnapshot) -> DispatchView:
        workers = snapshot.workers
        waiting = snapshot.waiting if snapshot.waiting.shape[0] == workers else None
        tokens = snapshot.waiting_tokens
        running_tokens = np.bincount(
            snapshot.active.worker, weights=snapshot.active.prompt_tokens, minlength=workers
        )
        return cls(
            snapshot.active_count.tolist(),
            [0] * workers if waiting is None else waiting.tolist(),
            running_tokens.astype(np.int64).tolist(),
            [0] * workers if tokens is None else tokens.tolist(),
            snapshot.capacity.tolist(),
        )

    def in_flight(self, g: int) -> int:
        return self.running[g] + self.waiting[g]

    @property
    def taking(self) -> list[bool]:
        """Workers a router sends to: one that takes nothing (capacity 0: draining or
        down) is out of its rotation, as a router's health check takes it out; when
        every worker is, all are candidates."""
        open_ = [c > 0 for c in self.capacity]
        return open_ if any(open_) else [True] * len(open_)

    def dispatch(self, g: int, prompt: int) -> None:
        self.waiting[g] += 1
        self.waiting_tokens[g] += prompt


class DispatchOnArrivalPolicy(Policy):
    """Every ready request of the round goes to a worker, in ready order; none is held."""

    holds_work = HoldsWork.WORKER_QUEUES

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        if not len(pool):
            return []
        view = DispatchView.of(snapshot)
        self.start_round(snapshot, view)
        admissions = []
        for request_id, prompt in zip(pool.request_ids, pool.prompt_tokens.tolist(), strict=True):
            g = self.choose(view, prompt)
            view.dispatch(g, prompt)
            admissions.append(Admission(request_id, snapshot.worker_ids[g]))
        return admissions

    def start_round(self, snapshot: FleetSnapshot, view: DispatchView) -> None:
        """Read what the rule needs from the snapshot before the round's first dispatch."""

    @abstractmethod
    def choose(self, view: DispatchView, prompt: int) -> int:
        """Index of the worker for the next request (any worker: no capacity check)."""


def _lowest(
    scores: list[float] | list[int], start: int = 0, taking: list[bool] | None = None
) -> int:
    """The index of the lowest score among the `taking` workers (all: None); ties to the
    first at or after `start`, cyclically."""
    workers = len(scores)
    allowed = taking if taking is not None else [True] * workers
    best = min(score for score, ok in zip(scores, allowed, strict=True) if ok)
    return next(
        (start + k) % workers
        for k in range(workers)
        if allowed[(start + k) % workers] and scores[(start + k) % workers] == best
    )


@register_policy("jsq")
class JoinShortestQueueDispatch(DispatchOnArrivalPolicy):
    """Fewest in-flight requests (running plus queued at the worker), ties to the lowest
    index: JSQ as routers deploy it. `random_ties` draws ties at random (seeded): A/A."""

    def __init__(self, seed: int = 0, random_ties: bool = False) -> None:
        self._rng = _random.Random(seed) if random_ties else None

    def choose(self, view: DispatchView, prompt: int) -> int:
        in_flight = [view.in_flight(g) for g in range(len(view.running))]
        taking = view.taking
        if self._rng is None:
            return _lowest(in_flight, taking=taking)
        fewest = min(n for n, ok in zip(in_flight, taking, strict=True) if ok)
        return self._rng.choice([g for g, n in enumerate(in_flight) if n == fewest and taking[g]])


@register_policy("ascend-proxy")
class AscendProxyPolicy(DispatchOnArrivalPolicy):
    """vllm-ascend's example load-balance proxy: the decoder with the least in-flight
    request-body bytes (a request adds its body length when dispatched and removes it
    when it finishes), ties to the lowest index, no capacity check."""

    def __init__(self, seed: int = 0) -> None:
        pass

    def choose(self, view: DispatchView, prompt: int) -> int:
        in_flight_bytes = [
            BODY_BYTES_PER_TOKEN * (view.running_tokens[g] + view.waiting_tokens[g])
            + BODY_ENVELOPE_BYTES * view.in_flight(g)
            for g in range(len(view.running))
        ]
        return _lowest(in_flight_bytes, taking=view.taking)


@register_policy("vllm-dplb")
class VllmDpLoadBalancerPolicy(DispatchOnArrivalPolicy):
    """vLLM's internal data-parallel balancer since vLLM PR #49204: the rank with the
    lowest `max(clients * inflight, waiting + running) + 6 * waiting * max(0, kv - 0.5)`,
    rotating tie-break (PR #47420).

    `waiting`, `running` and `kv` (KV usage, 0..1) are the counts the engines publish
    every `publish_ms` (~100 ms): between publications the balancer sees them stale.
    `inflight` is this front-end's own count of requests it sent to the rank and has not
    seen finish, exact and updated by each of its dispatches; `clients` front-ends share
    the fleet (one here). KV usage is the rank's KV tokens over `kv_capacity_tokens`.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        clients: int = 1,
        publish_ms: float = 100.0,
        kv_capacity_tokens: int = 400_000,
    ) -> None:
        if clients < 1 or publish_ms < 0 or kv_capacity_tokens < 1:
            raise ValueError(
                "vllm-dplb needs clients >= 1, publish_ms >= 0 and kv_capacity_tokens >= 1"
            )
        self.clients = clients
        self.publish_ms = publish_ms
        self.kv_capacity_tokens = kv_capacity_tokens
        self._published_at = -math.inf
        self._waiting: list[int] = []
        self._running: list[int] = []
        self._kv: list[float] = []
        self._rotation = 0

    def start_round(self, snapshot: FleetSnapshot, view: DispatchView) -> None:
        now = snapshot.now_ms
        stale = len(self._running) != snapshot.workers
        if stale or math.isnan(now) or now - self._published_at >= self.publish_ms:
            self._published_at = now if not math.isnan(now) else -math.inf
            self._waiting = list(view.waiting)
            self._running = list(view.running)
            self._kv = (snapshot.load / self.kv_capacity_tokens).tolist()

    def choose(self, view: DispatchView, prompt: int) -> int:
        scores = [
            max(self.clients * view.in_flight(g), self._waiting[g] + self._running[g])
            + 6 * self._waiting[g] * max(0.0, self._kv[g] - 0.5)
            for g in range(len(view.running))
        ]
        g = _lowest(scores, self._rotation % len(scores), view.taking)
        self._rotation += 1
        return g


@register_policy("vllm-dplb-legacy")
class VllmDpLoadBalancerLegacyPolicy(DispatchOnArrivalPolicy):
    """vLLM's data-parallel balancer before PR #49204: the rank with the lowest
    `4 * waiting + running` (ties: lowest index). The counts are read fresh each round
    and a request dispatched in the round counts as waiting on its rank."""

    def __init__(self, seed: int = 0) -> None:
        pass

    def choose(self, view: DispatchView, prompt: int) -> int:
        scores = [4 * w + r for w, r in zip(view.waiting, view.running, strict=True)]
        return _lowest(scores, taking=view.taking)


@register_policy("br0-bypass")
class BalanceRouteZeroBypass(DispatchOnArrivalPolicy):
    """The paper's pool-bypass variant of BR-0: each request, at prefill completion, goes
    to the worker with the highest single-request BR-0 score `s - G * max(0, s - m_g)` on
    a virtual load (running plus dispatched-not-yet-running tokens), so that its KV
    transfer overlaps the worker's compute instead of waiting in a pool.

    (choice) Only workers whose running plus queued requests are below `B` are scored
    while one exists (else all); ties go to the largest margin, then the lowest index.
    """

    def __init__(self, seed: int = 0) -> None:
        self._virtual: list[int] = []

    def start_round(self, snapshot: FleetSnapshot, view: DispatchView) -> None:
        self._virtual = [
            int(load) + queued
            for load, queued in zip(snapshot.load.tolist(), view.waiting_tokens, strict=True)
        ]

    def choose(self, view: DispatchView, prompt: int) -> int:
        workers = len(self._virtual)
        open_workers = [g for g in range(workers) if view.in_flight(g) < view.capacity[g]]
        candidates = open_workers or [g for g, ok in enumerate(view.taking) if ok]
        top = max(self._virtual)

        def rank(w: int) -> tuple[float, int, int]:
            margin = top - self._virtual[w]
            return f_score_br0(prompt, margin, workers), margin, -w

        g = max(candidates, key=rank)
        self._virtual[g] += prompt
        return g
