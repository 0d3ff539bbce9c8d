"""The decision audit: on the snapshot frozen just before each `dispatch`, what would
each shadow policy have done with that request, and what did the incumbent's choice do
to the barrier gap compared with the best choice?

F-scores are given in both forms: BR-0's (the exact change of the current gap) and
BR-H's (the discounted horizon, scored with a Survival predictor that learns from the
fleet's completed requests).

Each policy is run on the round the incumbent really ran: the whole ready pool and the
snapshot as the round's first dispatch saw them (dispatches at one timestamp are one
round), with everything the policy computes (BR-H's projection too) inside the timer. The
timer is the thread's CPU time: a policy is pure computation, and on a shared machine
wall time measures the neighbours (the same brh-survival rounds of a 10,000-request
replay: wall P99 12.4 ms, CPU P99 0.18 ms, on 2 busy cores), less any garbage
collection that ran meanwhile (the audit process's heap, not the policy's:
`stream.gc_time`). The round's time is its first decision's `latency_ms` (the others
of the round carry None, so the P99 is over rounds), and each request's choice is where
the policy's round put it (None: the policy held it). A policy that raises, or takes longer than
`decision_timeout_ms`, is a counted error (`AuditOutcome.errors`), never a crash.

The audit runs in an `AuditFollower`: it follows the applied event stream with its own
replica of the mirror (through the same `FleetCore` as the ingest path) and audits the
dispatches it is told to, on the replica frozen just before each. So it can run in a
worker process beside the ingest process: what crosses is the stream's items one way
and decisions the other, never snapshots.
"""

from __future__ import annotations

import time
from collections.abc import Container, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
import numpy as np

from shadow.policies import (
    BalanceRouteConfig,
    BalanceRouteHorizon,
    FleetSnapshot,
    Policy,
    ReadyPool,
    horizon_scores,
    make_policy,
)
from shadow.policies.snapshot import NO_KEY
from shadow.predict.predictors import SurvivalPredictor
from shadow.stream.fleet import FleetCore
from shadow.stream.gc_time import collection_seconds, watch_collections
from shadow.stream.invariants import InvariantConfig
from shadow.stream.items import DispatchItem, StreamItem, decode_stream
from shadow.stream.mirror import FleetMirror
from shadow.stream.projection import MaintainedProjection
from shadow.stream.stored_snapshot import pack as pack_snapshot

DEFAULT_SHADOW_POLICIES = ("jsq-pool", "br0", "brh-survival")
#: the frozen snapshot's JSON (msgspec: a tenth of `json.dumps`'s time at G = 256, where
#: the snapshot is 1,800 numbers and written for every audited dispatch)
_encode_json = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class AuditConfig:
    policies: tuple[str, ...] = DEFAULT_SHADOW_POLICIES
    balance_route: BalanceRouteConfig = field(default_factory=BalanceRouteConfig)
    #: a round slower than this has timed out: a router would have given up on it (the
    #: latency rule's 5 ms budget is a P99; this is the give-up point of one decision)
    decision_timeout_ms: float = field(default=50.0, metadata={"gt": 0})


class Decision(NamedTuple):
    """One shadow policy's view of one incumbent dispatch (a tuple: it crosses a process
    boundary thousands of times a second)."""

    fleet: str
    ts: float
    request_id: str
    prompt_tokens: int
    incumbent_worker: str
    incumbent_policy: str
    policy: str
    choice: str | None
    agrees: bool
    f_br0_incumbent: float
    f_br0_choice: float | None
    f_br0_best: float
    f_brh_incumbent: float
    f_brh_choice: float | None
    f_brh_best: float
    mirror_jsq_agrees: bool
    router_view_agrees: bool | None
    #: CPU time of this policy's whole round (projection included) on the first decision
    #: of the incumbent's round; None on the round's other decisions
    latency_ms: float | None
    #: the frozen snapshot's JSON as stored (`stream.stored_snapshot.pack`): {"workers",
    #: "loads", "active", "capacity", "f_brh"} (every worker's BR-H score for this
    #: request), on the dispatch's first decision only (None on the others; readers
    #: unpack and complete it: `storage.queries.with_snapshots`)
    snapshot_z: bytes | None


@dataclass(frozen=True)
class AuditJob:
    """One dispatch to audit, with the snapshot frozen just before it."""

    ingest_id: int
    fleet: str
    ts: float
    request_id: str
    prompt_tokens: int
    prompt_key: int
    incumbent_worker: str
    incumbent_policy: str
    router_view: Mapping[str, object] | None
    snapshot: FleetSnapshot
    #: BR-H's projection of `snapshot`, when the caller keeps one (`MaintainedProjection`);
    #: None: the auditor projects the snapshot itself
    projection: np.ndarray | None = None


@dataclass(frozen=True)
class AuditOutcome:
    fleet: str
    ingest_id: int
    decisions: tuple[Decision, ...]
    #: (policy, worker, free slots it had) for shadow choices of a worker with no room
    invalid: tuple[tuple[str, str, int], ...]
    #: (policy, what went wrong) for rounds that raised or timed out
    errors: tuple[tuple[str, str], ...] = ()


@dataclass
class _Round:
    """One policy round on the incumbent's round: where it put each request, how long it
    took, and what went wrong (reported once, with the round's first decision)."""

    ts: float
    #: the requests of the round's pool (a later dispatch of the round is one of them)
    pool: Container[str]
    choices: dict[str, dict[str, str]]
    latency: dict[str, float]
    invalid: list[tuple[str, str, int]]
    errors: list[tuple[str, str]]
    reported: bool = False
    #: BR-H's projection of the round's snapshot, made inside its timed round (None when
    #: BR-H is not audited or did not run): the audit's yardstick adopts it
    projection: np.ndarray | None = None


def _router_view_jsq(workers: Sequence[str], view: Mapping[str, object]) -> str | None:
    """What JSQ picks from the router's own view (fewest running, ties in worker order)."""
    best: tuple[int, int] | None = None
    choice = None
    for index, worker in enumerate(workers):
        entry = view.get(worker)
        running = entry.get("running") if isinstance(entry, Mapping) else None
        if running is None and entry is not None:
            running = getattr(entry, "running", None)
        if running is None:
            continue
        if best is None or (running, index) < best:
            best, choice = (running, index), worker
    return choice


class Auditor:
    """Audits one fleet's dispatches against the configured shadow policies."""

    def __init__(
        self,
        fleet: str,
        config: AuditConfig | None = None,
        predictor: SurvivalPredictor | None = None,
    ) -> None:
        """`predictor` learns from the fleet's completed requests (the mirror's own)."""
        watch_collections()
        self.fleet = fleet
        self.config = config or AuditConfig()
        self.predictor = predictor if predictor is not None else SurvivalPredictor()
        self.policies: dict[str, Policy] = {
            name: make_policy(
                name,
                config=self.config.balance_route,
                predictor=self.predictor if name == "brh-survival" else None,
            )
            for name in self.config.policies
        }
        self._jsq = self.policies.get("jsq-pool") or make_policy("jsq-pool")
        #: the projection kept across dispatches of the mirror this auditor follows
        self.projection = MaintainedProjection(self.predictor, self.config.balance_route.horizon)
        horizon = self.policies.get("brh-survival")
        # BR-H scores every choice; the survival policy (if audited) shares its projection.
        self._horizon: BalanceRouteHorizon = (
            horizon
            if isinstance(horizon, BalanceRouteHorizon)
            else BalanceRouteHorizon(self.predictor, self.config.balance_route)
        )
        self._ids: Sequence[Hashable] | None = None
        self._index: dict[Hashable, int] = {}

    def _positions(self, workers: Sequence[Hashable]) -> dict[Hashable, int]:
        """Worker id -> its index in the snapshot. The mirror hands out one tuple of ids
        until the fleet changes, so this is built once per change: at G = 256 scanning
        the tuple (`in`, `.index`) several times a dispatch was a visible part of it."""
        if workers is not self._ids:
            self._ids = workers
            self._index = {worker: g for g, worker in enumerate(workers)}
        return self._index

    def learn(self, lengths: Sequence[int]) -> None:
        if lengths:
            self.predictor.observe_many(np.asarray(lengths, dtype=np.int64))

    def run_round(
        self,
        ts: float,
        snapshot: FleetSnapshot,
        pool: ReadyPool,
        members: Container[str] = frozenset(),
    ) -> _Round:
        """Every policy's round on the incumbent's round (pool and snapshot), timed whole;
        `members` answers which requests were in its pool (`_RoundMembers`)."""
        workers = snapshot.worker_ids
        free = snapshot.free_slots
        timeout = self.config.decision_timeout_ms
        choices: dict[str, dict[str, str]] = {}
        latency: dict[str, float] = {}
        invalid: list[tuple[str, str, int]] = []
        errors: list[tuple[str, str]] = []
        open_slots = bool((free > 0).any())
        projection: np.ndarray | None = None
        for name, policy in self.policies.items():
            placed: dict[str, str] = {}
            started, collecting = time.thread_time(), collection_seconds()
            try:
                # a router with worker queues dispatches to a full worker too (it queues)
                queues = policy.dispatches_on_arrival
                if not (open_slots or queues):
                    admitted = []
                elif policy is self._horizon:
                    # its projection, made inside the timer as its own round makes it
                    projection = policy.project(snapshot)
                    admitted = policy.admit(snapshot, pool, projection)
                else:
                    admitted = policy.admit(snapshot, pool)
            except Exception as error:  # a candidate's bug is evidence, not a crash
                admitted = []
                errors.append((name, f"raised {type(error).__name__}: {error}"[:500]))
            # the policy's own CPU time: a collection that ran meanwhile is the audit
            # process's (its heap), not the policy's (`stream.gc_time`)
            spent = time.thread_time() - started - (collection_seconds() - collecting)
            elapsed = spent * 1000.0
            latency[name] = elapsed
            if elapsed > timeout:
                errors.append((name, f"timed out: {elapsed:.1f} ms > {timeout:g} ms"))
            taken: dict[str, int] = {}
            for request_id, worker in admitted:
                placed[str(request_id)] = str(worker)
                taken[str(worker)] = taken.get(str(worker), 0) + 1
            for worker, count in taken.items():
                g = self._positions(workers).get(worker)
                room = int(free[g]) if g is not None else 0
                if count > room and not policy.dispatches_on_arrival:
                    invalid.append((name, worker, room))
            choices[name] = placed
        return _Round(ts, members, choices, latency, invalid, errors, projection=projection)

    def audit(self, job: AuditJob, round_: _Round | None = None) -> AuditOutcome:
        """Score one dispatch; `round_` is the policies' round on the incumbent's round
        (run here on the job's snapshot and a pool of its request alone when not given)."""
        snapshot = job.snapshot
        workers = snapshot.worker_ids
        positions = self._positions(workers)
        incumbent = positions.get(job.incumbent_worker)
        if incumbent is None:
            return AuditOutcome(self.fleet, job.ingest_id, (), ())
        prompt = job.prompt_tokens
        free = snapshot.free_slots
        open_mask = free > 0
        any_open = bool(open_mask.any())
        single = ReadyPool([job.request_id], np.array([prompt]), np.array([job.prompt_key]))
        if round_ is None:
            round_ = self.run_round(job.ts, snapshot, single)

        loads = snapshot.load
        margins = (loads.max() - loads).astype(np.float64)
        br0 = prompt - snapshot.workers * np.maximum(0.0, prompt - margins)
        projection = job.projection
        if projection is None:
            projection = self._horizon.project(snapshot)
        brh = horizon_scores(projection, self.config.balance_route, prompt)
        scored = open_mask if any_open else np.ones_like(open_mask)

        first = not round_.reported
        round_.reported = True
        choices = {name: placed.get(job.request_id) for name, placed in round_.choices.items()}
        jsq_choice = None
        if any_open:
            admitted = self._jsq.admit(snapshot, single)
            jsq_choice = admitted[0].worker if admitted else None
        view_choice = _router_view_jsq(workers, job.router_view) if job.router_view else None

        # Stored once per dispatch, on its first decision row, and without what the loads
        # and the prompt give (margins, BR-0's scores: `storage.queries.complete_snapshot`):
        # at G = 256 it is ~7.8 KB, and writing it whole for each policy was most of the
        # server's commit time. Packed here, compressed when large (`stored_snapshot`).
        frozen: bytes | None = pack_snapshot(
            _encode_json(
                {
                    "workers": list(map(str, workers)),
                    "loads": loads.tolist(),
                    "active": snapshot.active_count.tolist(),
                    "capacity": snapshot.capacity.tolist(),
                    "f_brh": np.round(brh, 3).tolist(),
                }
            )
        )
        br0_best = float(br0[scored].max())
        brh_best = float(brh[scored].max())
        decisions = []
        for name, choice in choices.items():
            index = positions.get(choice) if choice is not None else None
            decisions.append(
                Decision(
                    self.fleet,
                    job.ts,
                    job.request_id,
                    prompt,
                    job.incumbent_worker,
                    job.incumbent_policy,
                    name,
                    None if choice is None else str(choice),
                    choice == job.incumbent_worker,
                    float(br0[incumbent]),
                    None if index is None else float(br0[index]),
                    br0_best,
                    float(brh[incumbent]),
                    None if index is None else float(brh[index]),
                    brh_best,
                    jsq_choice == job.incumbent_worker,
                    None if view_choice is None else view_choice == job.incumbent_worker,
                    round_.latency[name] if first else None,
                    frozen,
                )
            )
            frozen = None  # the dispatch's other rows find it on this one
        return AuditOutcome(
            self.fleet,
            job.ingest_id,
            tuple(decisions),
            tuple(round_.invalid) if first else (),
            tuple(round_.errors) if first else (),
        )


class AuditFollower:
    """Follows the applied stream of every fleet with a replica mirror, and audits."""

    def __init__(
        self,
        config: AuditConfig | None = None,
        invariants: InvariantConfig | None = None,
        sweep_every_s: float = 5.0,
    ) -> None:
        self.config = config or AuditConfig()
        self.invariants = invariants
        self.sweep_every_s = sweep_every_s
        self.fleets: dict[str, tuple[FleetCore, Auditor]] = {}
        #: per fleet, the policies' round on the incumbent's current round
        self._rounds: dict[str, _Round] = {}

    def _fleet(self, fleet: str) -> tuple[FleetCore, Auditor]:
        pair = self.fleets.get(fleet)
        if pair is None:
            # a replica: the ingest path's core reports the violations
            core = FleetCore(fleet, self.invariants, self.sweep_every_s, checks=False)
            pair = self.fleets[fleet] = (core, Auditor(fleet, self.config, core.mirror.predictor))
        return pair

    def run(self, stream: Sequence[StreamItem]) -> list[AuditOutcome]:
        outcomes = []
        for item in stream:
            core, auditor = self._fleet(item.fleet)
            if item.__class__ is DispatchItem and item.audit is not None:  # type: ignore[attr-defined]
                outcomes.append(self._audit(core, auditor, item))  # type: ignore[arg-type]
            core.apply(item)
        return outcomes

    def _audit(self, core: FleetCore, auditor: Auditor, item: DispatchItem) -> AuditOutcome:
        """Audit one dispatch on the replica as it is just before the dispatch applies.

        The incumbent's round is the run of dispatches at one timestamp: its first one
        sees the round's pool and snapshot, and the policies run their round on those
        once; the round's later dispatches are scored against where that round put them.
        """
        audit = item.audit
        assert audit is not None
        mirror = core.mirror
        request = mirror.requests.get(item.request_id)
        round_ = self._rounds.get(item.fleet)
        new_round = round_ is None or round_.ts != item.ts or item.request_id not in round_.pool
        # the policies' round reads every active request; a later dispatch of the round is
        # scored on loads and counts, and its projection changes one worker's row
        snapshot = mirror.snapshot(with_active=new_round)
        if new_round:
            ids, prompts, keys = mirror.ready.columns()
            extra = None
            if request is not None and item.request_id not in mirror.pool:
                # dispatched without a ready pool entry: its own round
                extra = item.request_id
                ids = np.append(ids, np.array([extra], dtype=object))
                prompts = np.append(prompts, request.prompt_tokens)
                keys = np.append(keys, request.prompt_key)
            members = _RoundMembers(mirror, mirror.ready.next_seq, extra)
            ready = ReadyPool(ids, prompts, keys)
            round_ = auditor.run_round(item.ts, snapshot, ready, members)
            self._rounds[item.fleet] = round_
        assert isinstance(round_.pool, _RoundMembers)
        round_.pool.note_dispatch(item.request_id)
        return auditor.audit(
            AuditJob(
                audit.ingest_id, item.fleet, item.ts, item.request_id,
                request.prompt_tokens if request is not None else 0,
                request.prompt_key if request is not None else int(NO_KEY),
                item.worker, audit.policy, audit.router_view, snapshot,
                auditor.projection.current(
                    mirror, snapshot, round_.projection if new_round else None
                ),
            ),
            round_,
        )  # fmt: skip


class _RoundMembers:
    """The requests in a round's pool, without listing them: those in the mirror's pool
    since before the round began (its sequence number then), the one dispatched without
    a pool entry that made the round, and those of them the round has dispatched so far.
    A set of the pool's ids built each round walked the whole pool in Python."""

    __slots__ = ("dispatched", "extra", "mirror", "seq")

    def __init__(self, mirror: FleetMirror, seq: int, extra: str | None) -> None:
        self.mirror = mirror
        self.seq = seq
        self.extra = extra
        self.dispatched: set[str] = set()

    def __contains__(self, request_id: object) -> bool:
        if request_id == self.extra or request_id in self.dispatched:
            return True
        request = self.mirror.pool.get(request_id)  # type: ignore[call-overload]
        return request is not None and self.mirror.ready.added_before(request, self.seq)

    def note_dispatch(self, request_id: str) -> None:
        """The round's request `request_id` is being dispatched (it leaves the pool)."""
        if request_id in self:
            self.dispatched.add(request_id)


#: The follower of a worker process (set by `start_worker`).
_WORKER: AuditFollower | None = None


def start_worker(
    config: AuditConfig, invariants: InvariantConfig | None, sweep_every_s: float
) -> None:
    """Process-pool initializer: one follower per worker process, alive across batches."""
    global _WORKER
    _WORKER = AuditFollower(config, invariants, sweep_every_s)


def run_in_worker(stream: bytes) -> list[AuditOutcome]:
    """Audit one batch of the stream, as `encode_stream` sent it, in the worker process."""
    assert _WORKER is not None, "start_worker was not run in this process"
    return _WORKER.run(decode_stream(stream))
