"""The ingest path, shared by `POST /v1/events` and `shadow ingest`.

    validated events -> dedupe -> durable append (then acknowledge) -> reorder buffer
        -> apply in stream order: invariants, decision audit, mirror, windows
        -> derived rows + checkpoint -> due windows replayed (inline or in a worker process)

Duplicates are normal: the same `(fleet, source, seq)` again, a cumulative progress that
is not ahead, an engine step already counted. Out-of-order events within the reorder
window (event time) are applied in order; later stragglers are applied when they come and
counted. A restart re-applies every stored event to rebuild the mirror and re-derives the
decisions and violations of events after the checkpoint.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import queue
import threading
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from operator import itemgetter
from types import SimpleNamespace
from typing import Any

import numpy as np
from msgspec.structs import asdict as struct_fields

from shadow.analysis.stepmodel import StepModelFit, fit_step_model
from shadow.events import EventError, RouterView
from shadow.replay.workload import StepModel
from shadow.service.ingest.committer import CommitJob, GroupCommitter
from shadow.service.ingest.seen import RecentInts
from shadow.service.store import EventBatch, ServiceStore
from shadow.stream.audit import AuditConfig, AuditFollower, AuditOutcome, Decision, run_in_worker
from shadow.stream.fleet import FleetCore, StreamItem
from shadow.stream.invariants import InvariantConfig, Violation
from shadow.stream.mirror import NATURAL_FINISH
from shadow.stream.windows import WindowConfig, WindowResult, WindowTracker, evaluate_window

log = logging.getLogger(__name__)
ORDER = {"worker": 0, "engine_step": 1, "progress": 2, "finish": 3, "ready": 4, "dispatch": 5}
MAX_PENDING_SAMPLES = 1000
STEP_SAMPLES_KEPT = 50_000  # the last ~6,000 steps of an 8-worker fleet
#: how often the progress log is folded into `progress_latest` (see migration 0008)
PROGRESS_FOLD_EVERY_S = 5.0


@dataclass(frozen=True)
class PipelineConfig:
    """The ingest path. A field's `metadata` holds the bounds a configured value must meet
    (`ge`, `gt`, `le`, `lt`; the settings check them)."""

    reorder_window_s: float = field(default=2.0, metadata={"ge": 0})
    seq_window: int = 1_000_000
    ghost_sweep_every_s: float = 5.0
    audit_enabled: bool = True
    windows_enabled: bool = True
    step_fit_min_samples: int = 50
    default_step_model: StepModel = field(default_factory=StepModel)
    audit: AuditConfig = field(default_factory=AuditConfig)
    invariants: InvariantConfig = field(default_factory=InvariantConfig)
    windows: WindowConfig = field(default_factory=WindowConfig)
    limits: Limits = field(default_factory=lambda: Limits())


@dataclass(frozen=True)
class Limits:
    """Bounds on what one service instance holds; each hit is counted (`bound_hits`)."""

    #: events waiting in the reorder window; past it, everything buffered is applied now
    max_reorder_events: int = field(default=1_000_000, metadata={"ge": 1000})
    max_fleets: int = field(default=64, metadata={"ge": 1})
    max_workers_per_fleet: int = field(default=1024, metadata={"ge": 1})
    #: requests ready or running in one fleet; more `ready` events are rejected
    max_active_per_fleet: int = field(default=200_000, metadata={"ge": 1})
    #: dedupe memory of a finished request's progress is kept this long (fleet time)
    finished_ttl_s: float = field(default=300.0, metadata={"gt": 0})
    #: batches handed to the audit worker and not audited yet; past it, ingest waits for
    #: the oldest (the audit's memory and lag stay bounded when it falls behind)
    max_audit_backlog: int = field(default=64, metadata={"ge": 1})


BOUNDS = ("body_bytes", "batch_events", "reorder_buffer", "fleets", "workers_per_fleet",
          "active_per_fleet", "page_size", "audit_backlog")  # fmt: skip


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[EventError] = field(default_factory=list)

    def as_json(self, error_limit: int = 1000) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "errors": [
                {"position": e.position, "line": e.line, "field": e.field, "message": e.message}
                for e in self.errors[:error_limit]
            ],
        }


_INGEST_ID = itemgetter(2)


class _ReorderBuffer:
    """Events waiting for their turn, released in `(ts, class order, ingest_id)` order.

    Each fleet's stream is nearly always in order, while fleets interleave: an entry that
    sorts after its fleet's last one is appended to that fleet's run (sorted), a
    straggler goes to a heap. A release cuts each run at `upto` (a bisection), takes
    the heap's entries up to it and sorts the lot once: a merge of a few sorted runs,
    in C. (One run for all fleets sent most entries of interleaved fleets to the heap:
    two log-n heap operations each.)
    Entries compare whole: ingest ids are unique, so a comparison never reaches the event.
    """

    def __init__(self) -> None:
        self._runs: dict[str, list[tuple[float, int, int, Any]]] = {}
        self._late: list[tuple[float, int, int, Any]] = []

    def __len__(self) -> int:
        return sum(map(len, self._runs.values())) + len(self._late)

    def push(self, entry: tuple[float, int, int, Any]) -> None:
        fleet = entry[3].fleet
        run = self._runs.get(fleet)
        if run is None:
            run = self._runs[fleet] = []
        if not run or entry > run[-1]:
            run.append(entry)
        else:
            heapq.heappush(self._late, entry)

    def pop_until(self, upto: float) -> list[tuple[float, int, int, Any]]:
        """Remove and return, in order, every entry with a time up to `upto`."""
        released: list[tuple[float, int, int, Any]] = []
        cut = (upto, math.inf)  # after every entry at `upto`, before any later one
        for run in self._runs.values():
            if run and run[0][0] <= upto:
                end = bisect_right(run, cut)
                released += run[:end]
                del run[:end]
        late = self._late
        while late and late[0][0] <= upto:
            released.append(heapq.heappop(late))
        released.sort()
        return released

    def lowest_id(self) -> int | None:
        ids = [min(map(_INGEST_ID, run)) for run in self._runs.values() if run]
        if self._late:
            ids.append(min(map(_INGEST_ID, self._late)))
        return min(ids) if ids else None


class FleetState:
    """Everything the service knows of one fleet."""

    def __init__(self, fleet: str, config: PipelineConfig) -> None:
        self.fleet = fleet
        self.core = FleetCore(fleet, config.invariants, config.ghost_sweep_every_s)
        self.mirror = self.core.mirror
        self.checker = self.core.checker
        self.tracker = WindowTracker(fleet, self.mirror, config.windows)
        #: recent (step, kv, ms, ts) per worker step for the step-model fit; bounded, as
        #: the fit wants the fleet as it is now
        self.step_samples: deque[tuple[int, int, float, float]] = deque(maxlen=STEP_SAMPLES_KEPT)
        self.fit: StepModelFit | None = None
        #: engine steps where the mirror's load or active count differed from the engine's
        self.state_mismatches = 0
        self.engine_steps = 0
        self.late_events = 0
        self.window_failures = 0
        self.incumbent = "jsq"
        self.stored_windows: set[int] = set()
        #: engine scrapes waiting for the mirror to reach their time: (ts, worker, sample)
        self.pending_samples: list[tuple[float, str, Any]] = []
        #: per worker: (ts of the last scrape, engine running, mirror active then)
        self.last_sample: dict[str, tuple[float, float, int]] = {}


class Pipeline:
    """One service instance's ingest path over one DuckDB file."""

    def __init__(
        self,
        store: ServiceStore,
        config: PipelineConfig | None = None,
        executor: Executor | None = None,
        audit_executor: Executor | None = None,
    ) -> None:
        """`executor` evaluates windows and `audit_executor` runs the decision audit
        (each a one-process pool, see `shadow.service.workers`); without them both run
        inline, in this process."""
        self.store = store
        self.config = config or PipelineConfig()
        self.executor = executor
        self.audit_executor = audit_executor
        self._follower = (
            AuditFollower(
                self.config.audit, self.config.invariants, self.config.ghost_sweep_every_s
            )
            if audit_executor is None
            else None
        )
        self._audit_done: list[AuditOutcome] = []
        self._audit_pending: list[tuple[float, Future[list[AuditOutcome]]]] = []
        self._incoming_samples: queue.SimpleQueue[tuple[str, float, str, Any]] = queue.SimpleQueue()
        self.fleets: dict[str, FleetState] = {}
        self.lock = threading.RLock()
        self._buffer = _ReorderBuffer()
        self._max_ts = float("-inf")
        self._last_applied: tuple[float, int] = (float("-inf"), -1)
        self._next_id = 1
        self._seqs: dict[tuple[str, str], RecentInts] = {}
        self._steps_seen: dict[tuple[str, str], RecentInts] = {}
        self._progress_seen: dict[tuple[str, str], int] = {}
        self._pending_windows: list[tuple[FleetState, Future[WindowResult]]] = []
        self.windows_evaluated = 0
        #: (fleet, event type, accepted|duplicate) -> events, for /metrics
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.rejected = 0
        #: bound name (BOUNDS) -> times it was hit, for /metrics
        self.bound_hits: Counter[str] = Counter({name: 0 for name in BOUNDS})
        self._admitted_workers: dict[str, set[str]] = {}
        self._finished_progress: deque[tuple[float, tuple[str, str]]] = deque()
        #: What broke the pipeline ("" while it works): a commit failed after the batch
        #: was applied in memory, or applying failed; the owner must build a new pipeline
        #: from the database (`start`) before submitting more.
        self.broken_reason = ""
        #: writes acknowledged batches in order, outside the lock (see `committer`)
        self.committer = GroupCommitter(
            store.commit,
            on_failure=self._commit_failed,
            maintain=store.compact_progress,
            maintain_every_s=PROGRESS_FOLD_EVERY_S,
        )
        #: called with (fleet state, window result) after each stored window (the modes)
        self.on_window: Callable[[FleetState, WindowResult], None] | None = None

    # -- start-up -------------------------------------------------------------------

    def start(self) -> int:
        """Rebuild state from the database; returns how many stored events were applied."""
        with self.lock:
            self.store.compact_progress()
            applied_through = self.store.state("applied_through", 0)
            self._next_id = self.store.state("next_ingest_id", 1)
            self.store.drop_derived_after(applied_through)
            for fleet, indices in self.store.window_indices().items():
                self._fleet(fleet).stored_windows |= indices
            for (fleet, source), seqs in self.store.recent_seqs(self.config.seq_window).items():
                self._seq_memory(fleet, source).seed(seqs)
            for (fleet, source), high in self.store.seq_highs().items():
                memory = self._seq_memory(fleet, source)
                memory.restored_high = max(memory.restored_high, high)
            count = 0
            violations: list[tuple[int, Violation]] = []
            stream: list[StreamItem] = []
            stored = list(self.store.stored_events())
            # What was still in the reorder window when the service stopped (never applied)
            # goes back into it: a straggler that comes now must still sort before it.
            hold_after = (stored[-1][0] if stored else 0.0) - self.config.reorder_window_s
            for ts, _, ingest_id, kind, fields in stored:
                event = _stored_event(kind, fields)
                if kind == "engine_step":
                    self._steps_memory(event.fleet, event.worker).add(event.step)
                elif kind == "progress":
                    self._progress_seen[(event.fleet, event.request_id)] = event.generated
                elif kind == "finish":
                    self._finished_progress.append((ts, (event.fleet, event.request_id)))
                elif kind == "worker":
                    self._admitted_workers.setdefault(event.fleet, set()).add(event.worker)
                self._admitted_workers.setdefault(event.fleet, set())
                self._max_ts = max(self._max_ts, ts)
                count += 1
                if ingest_id > applied_through and ts > hold_after:
                    self._buffer.push((ts, ORDER[kind], ingest_id, event))
                    continue
                derive = ingest_id > applied_through
                self._apply(event, ingest_id, violations, stream, derive=derive)
                self._last_applied = (ts, ORDER[kind])
            self._forget_finished_progress()
            self._forget_finished(stream)
            self._audit(stream)
            decisions, audited = self._collect_audits(wait=True)
            self.committer.submit(
                EventBatch(), self._next_id, decisions, violations + audited, self._checkpoint()
            ).wait()
            return count

    def close(self) -> None:
        """Commit what is queued and stop the commit thread (after `drain`)."""
        self.committer.close()

    @property
    def broken(self) -> bool:
        return bool(self.broken_reason)

    def _commit_failed(self, error: BaseException) -> None:
        # memory ran ahead of the database: rebuild before more
        self.broken_reason = "a storage failure"

    # -- receipt --------------------------------------------------------------------

    def _seq_memory(self, fleet: str, source: str) -> RecentInts:
        memory = self._seqs.get((fleet, source))
        if memory is None:
            memory = self._seqs[(fleet, source)] = RecentInts(self.config.seq_window)
        return memory

    def _steps_memory(self, fleet: str, worker: str) -> RecentInts:
        memory = self._steps_seen.get((fleet, worker))
        if memory is None:
            memory = self._steps_seen[(fleet, worker)] = RecentInts(100_000)
        return memory

    def submit(
        self, events: Iterable[tuple[int, Any]], errors: Sequence[EventError] = ()
    ) -> IngestResult:
        """Store a validated batch durably, then apply what the reorder window releases.

        Returns once the batch is committed: what it counts as accepted is acknowledged.
        """
        result, job = self.enqueue(events, errors)
        if job is not None:
            job.wait()  # acknowledged only once durable
        return result

    def enqueue(
        self, events: Iterable[tuple[int, Any]], errors: Sequence[EventError] = ()
    ) -> tuple[IngestResult, CommitJob | None]:
        """`submit` without the wait: the batch is applied and queued for commit; it is
        acknowledged once the returned job's `wait` returns (None: nothing to store)."""
        result = IngestResult(rejected=len(errors), errors=list(errors))
        self.rejected += len(errors)
        job: CommitJob | None = None
        with self.lock:
            if self.broken:
                raise RuntimeError(
                    "the ingest pipeline lost a commit; restart it from the database"
                )
            try:
                batch = EventBatch()
                fresh: list[tuple[float, int, int, Any]] = []
                next_id = self._next_id
                # Per event, this loop is the service's hottest Python: the checks that
                # rarely apply (bounds) are skipped by kind, attributes are read once, and
                # what a batch nearly always repeats (its source, its fleet) is looked up
                # once per run of equal values rather than per event.
                admitted = self._admitted_workers
                seen_progress = self._progress_seen
                counts = self.counts
                lifecycle, steps, progress = batch.lifecycle, batch.steps, batch.progress
                #: (fleet, source) -> its seq memory, for sources with an accepted event
                sources: dict[tuple[str, str], RecentInts] = {}
                #: the last event's source and its seq memory
                last_fleet = last_source = None
                memory: RecentInts | None = None
                recorded: RecentInts | None = None  # the last memory put in `sources`
                #: fleet -> event type -> accepted, added to `counts` after the loop
                accepted: dict[str, Counter[str]] = {}
                tally: Counter[str] = Counter()
                tally_fleet = None
                for position, event in events:
                    kind = event.type
                    fleet = event.fleet
                    if kind == "worker" or kind == "ready" or fleet not in admitted:
                        refused = self._over_bound(event)
                        if refused is not None:
                            bound, field_name, message = refused
                            self.bound_hits[bound] += 1
                            result.rejected += 1
                            self.rejected += 1
                            result.errors.append(EventError(position, None, field_name, message))
                            continue
                    seq = event.seq
                    if seq is None:
                        source_memory = None
                    else:
                        source = event.source
                        if fleet != last_fleet or source != last_source:
                            last_fleet, last_source = fleet, source
                            memory = self._seq_memory(fleet, source)
                        source_memory = memory
                    if (source_memory is not None and not source_memory.add(seq)) or (
                        (kind == "progress" or kind == "engine_step")  # deduped by content
                        and not self._is_new(event, kind, source_memory)
                    ):
                        result.duplicates += 1
                        counts[(fleet, kind, "duplicate")] += 1
                        continue
                    ingest_id = next_id
                    next_id += 1
                    if source_memory is not None and source_memory is not recorded:
                        recorded = sources[(fleet, last_source)] = source_memory
                    if kind == "engine_step":
                        steps.append(
                            (
                                ingest_id,
                                fleet,
                                event.source,
                                seq,
                                event.worker,
                                event.step,
                                event.ts,
                                event.duration_ms,
                                event.running,
                                event.kv_tokens,
                                event.waiting,
                            )
                        )
                    elif kind == "progress":
                        key = (fleet, event.request_id)
                        if seen_progress.get(key, -1) < event.generated:
                            seen_progress[key] = event.generated
                            progress[key] = (*key, event.generated, event.ts, ingest_id)
                    else:
                        lifecycle.append(_lifecycle_row(ingest_id, event))
                        if kind == "finish":
                            self._finished_progress.append((event.ts, (fleet, event.request_id)))
                    fresh.append((event.ts, ORDER[kind], ingest_id, event))
                    if fleet != tally_fleet:
                        tally_fleet = fleet
                        tally = accepted.setdefault(fleet, Counter())
                    tally[kind] += 1
                for fleet, kinds in accepted.items():
                    for kind, count in kinds.items():
                        counts[(fleet, kind, "accepted")] += count
                result.accepted = len(fresh)
                for key, memory in sources.items():
                    batch.seq_high[key] = memory.high
                if fresh:
                    self._next_id = next_id
                    for entry in fresh:
                        self._buffer.push(entry)
                        if entry[0] > self._max_ts:
                            self._max_ts = entry[0]
                    upto = self._max_ts - self.config.reorder_window_s
                    if len(self._buffer) > self.config.limits.max_reorder_events:
                        self.bound_hits["reorder_buffer"] += 1
                        upto = self._max_ts  # apply what is held now rather than hold more
                    job = self._release(upto, batch)
                    self._forget_finished_progress()
            except BaseException as error:
                # the memory of seqs, ids and the mirror may have run ahead of the
                # database: nothing more until it is rebuilt from there
                self.broken_reason = (
                    "the audit worker process died"
                    if isinstance(error, BrokenProcessPool)
                    else f"an internal error ({type(error).__name__})"
                )
                raise
        return result, job

    def _over_bound(self, event: Any) -> tuple[str, str, str] | None:
        """(bound, field, message) when admitting `event` would pass a bound."""
        limits = self.config.limits
        fleet = event.fleet
        workers = self._admitted_workers.get(fleet)
        if workers is None:
            if len(self._admitted_workers) >= limits.max_fleets:
                return ("fleets", "fleet", f"fleet {fleet!r} would pass max_fleets "
                        f"({limits.max_fleets}); the service holds that many fleets")  # fmt: skip
            workers = self._admitted_workers[fleet] = set()
        kind = event.type
        if kind == "worker" and event.worker not in workers:
            if len(workers) >= limits.max_workers_per_fleet:
                cap = limits.max_workers_per_fleet
                message = f"fleet {fleet!r} already has max_workers_per_fleet ({cap}) workers"
                return ("workers_per_fleet", "worker", message)
            workers.add(event.worker)
        elif kind == "ready":
            state = self.fleets.get(fleet)
            if state is not None:
                mirror = state.mirror
                held = len(mirror.pool) + sum(len(w.active) for w in mirror.order)
                if held >= limits.max_active_per_fleet:
                    return ("active_per_fleet", "request_id", f"fleet {fleet!r} holds "
                            f"max_active_per_fleet ({limits.max_active_per_fleet}) ready or "
                            "running requests")  # fmt: skip
        return None

    def _forget_finished_progress(self) -> None:
        """Progress dedupe memory of requests finished `finished_ttl_s` ago goes."""
        horizon = self._max_ts - self.config.limits.finished_ttl_s
        finished = self._finished_progress
        while finished and finished[0][0] < horizon:
            self._progress_seen.pop(finished.popleft()[1], None)

    def _forget_finished(self, stream: list[StreamItem]) -> None:
        """Finished requests leave the mirrors `finished_ttl_s` (fleet time) after they
        finished; the audit follower's replica forgets at the same point of the stream."""
        for state in self.fleets.values():
            before = state.mirror.now - self.config.limits.finished_ttl_s
            if before > state.mirror.forgotten_before:
                state.core.forget(before)
                if self.config.audit_enabled:
                    stream.append(("forget", state.mirror.now, state.fleet, before))

    def _is_new(self, event: Any, kind: str, memory: RecentInts | None) -> bool:
        """Whether an event not seen by its seq (`memory` holds its source's seqs, None
        without a seq) is new by its content: progress ahead, an engine step not counted."""
        if kind == "progress":
            seen = self._progress_seen.get((event.fleet, event.request_id), -1)
            if event.generated == seen:
                return False
            # Progress seqs are not stored: after a restart, a progress sent before it that
            # is not ahead is a resent one, not a decrease.
            return not (
                memory is not None and event.seq <= memory.restored_high
                and event.generated < seen
            )  # fmt: skip
        if kind == "engine_step":
            return self._steps_memory(event.fleet, event.worker).add(event.step)
        return True

    # -- apply ----------------------------------------------------------------------

    def drain(self) -> None:
        """Apply everything buffered (end of a file, an idle stream, shutdown)."""
        with self.lock:
            self._wait(self._release(float("inf")))
            self.flush_audits()

    def _release(self, upto: float, batch: EventBatch | None = None) -> CommitJob | None:
        """Apply buffered events up to `upto`, then queue `batch` (the events being
        acknowledged) with everything derived for one transaction; the caller waits for
        it to commit (None: nothing to write)."""
        violations: list[tuple[int, Violation]] = []
        stream: list[StreamItem] = []
        applied = 0
        for ts, order, ingest_id, event in self._buffer.pop_until(upto):
            if (ts, order) < self._last_applied:
                self._fleet(event.fleet).late_events += 1
            else:
                self._last_applied = (ts, order)
            self._apply(event, ingest_id, violations, stream, derive=True)
            applied += 1
        if applied:
            self._forget_finished(stream)
        self._audit(stream)
        decisions, audited = self._collect_audits()
        batch = batch or EventBatch()
        while not self._incoming_samples.empty():
            fleet, ts, worker, sample = self._incoming_samples.get_nowait()
            pending = self._fleet(fleet).pending_samples
            heapq.heappush(pending, (ts, worker, sample))
            if len(pending) > MAX_PENDING_SAMPLES:  # the stream stalled: keep the newest
                pending.sort()
                del pending[: len(pending) - MAX_PENDING_SAMPLES]
        for state in self.fleets.values():
            if state.pending_samples:
                self._check_samples(state, violations, batch)
        job = None
        if batch or applied or decisions or violations:
            job = self.committer.submit(
                batch, self._next_id, decisions, violations + audited, self._checkpoint()
            )
        if applied and self.config.windows_enabled:
            self._schedule_windows()
        return job

    def _wait(self, job: CommitJob | None) -> None:
        if job is not None:
            job.wait()

    def _checkpoint(self) -> int:
        """The highest ingest id through which every event is applied and audited."""
        through = self._next_id - 1
        lowest = self._buffer.lowest_id()
        if lowest is not None:
            through = min(through, lowest - 1)
        for first, _ in self._audit_pending:  # batches of learning only have no first id
            if first != float("inf"):
                through = min(through, int(first) - 1)
                break
        return through

    # -- the decision audit ---------------------------------------------------------

    def _audit(self, stream: list[StreamItem]) -> None:
        """Hand the applied stream to the audit follower (here, or in its process)."""
        if not stream:
            return
        if self._follower is not None:
            self._audit_done.extend(self._follower.run(stream))
            return
        first = next(
            (item[5][0] for item in stream if item[0] == "dispatch" and item[5] is not None),
            float("inf"),
        )
        pending = self._audit_pending
        pending.append((first, self.audit_executor.submit(run_in_worker, stream)))
        if len(pending) > self.config.limits.max_audit_backlog:
            # the worker fell behind: wait for its oldest batch rather than queue more
            self.bound_hits["audit_backlog"] += 1
            self._audit_done.extend(pending.pop(0)[1].result())

    @property
    def audit_backlog(self) -> int:
        """Batches handed to the audit worker whose decisions are not collected yet: a
        backlog that keeps growing means the worker cannot keep up with ingest."""
        return len(self._audit_pending)

    def _collect_audits(
        self, wait: bool = False
    ) -> tuple[list[tuple[int, Decision]], list[tuple[int, Violation]]]:
        outcomes, self._audit_done = self._audit_done, []
        while self._audit_pending and (wait or self._audit_pending[0][1].done()):
            outcomes.extend(self._audit_pending.pop(0)[1].result())
        decisions: list[tuple[int, Decision]] = []
        violations: list[tuple[int, Violation]] = []
        for outcome in outcomes:
            decisions.extend((outcome.ingest_id, d) for d in outcome.decisions)
            if outcome.invalid:
                checker = self._fleet(outcome.fleet).checker
                for policy, worker, free in outcome.invalid:
                    made = checker.shadow_decision(
                        outcome.decisions[0].ts,
                        policy,
                        outcome.decisions[0].request_id,
                        worker,
                        free,
                    )
                    violations.extend((outcome.ingest_id, v) for v in made)
        return decisions, violations

    def flush_audits(self) -> None:
        """Wait for every audit in flight and store its decisions."""
        with self.lock:
            decisions, violations = self._collect_audits(wait=True)
            if decisions or violations:
                self.committer.submit(
                    EventBatch(), self._next_id, decisions, violations, self._checkpoint()
                ).wait()

    def _fleet(self, fleet: str) -> FleetState:
        state = self.fleets.get(fleet)
        if state is None:
            state = self.fleets[fleet] = FleetState(fleet, self.config)
        return state

    def _apply(
        self,
        event: Any,
        ingest_id: int,
        violations: list[tuple[int, Violation]],
        stream: list[StreamItem],
        *,
        derive: bool,
    ) -> None:
        state = self._fleet(event.fleet)
        core, mirror = state.core, state.mirror
        kind, ts, fleet = event.type, event.ts, event.fleet
        windows = self.config.windows_enabled
        audit = self.config.audit_enabled
        tracker = state.tracker
        if windows:
            tracker.before_event(kind, ts)
        if kind == "engine_step":
            found, view = core.engine_step(
                ts, event.worker, event.step, event.running, event.duration_ms
            )
            if view is not None:
                kv = event.kv_tokens if event.kv_tokens is not None else view.kv_tokens
                if view.running != event.running or kv != view.kv_tokens:
                    state.state_mismatches += 1
                state.engine_steps += 1
                state.step_samples.append((event.step, kv, event.duration_ms, ts))
                if windows:
                    tracker.on_engine_step(
                        ts, event.worker, event.step, event.duration_ms, event.running, kv
                    )
            if audit:
                stream.append(
                    (kind, ts, fleet, event.worker, event.step, event.running, event.duration_ms)
                )
        elif kind == "progress":
            found = core.progress(ts, event.request_id, event.generated)
            if windows:
                info = tracker.requests.get(event.request_id)
                if info is not None and event.generated > info.progress:
                    info.progress = event.generated
            if audit:
                stream.append((kind, ts, fleet, event.request_id, event.generated))
        elif kind == "dispatch":
            if audit:
                request = mirror.requests.get(event.request_id)
                first = (request is None and not mirror.is_stale(ts, event.request_id)) or (
                    request is not None and request.worker is None and not request.finished
                )
                audited = None
                if derive and first and event.worker in mirror.workers:
                    view = event.router_view
                    if view is not None:
                        view = {
                            k: struct_fields(v) if isinstance(v, RouterView) else v
                            for k, v in view.items()
                        }
                    audited = (ingest_id, event.policy, view)
                stream.append((kind, ts, fleet, event.request_id, event.worker, audited))
            found = core.dispatch(ts, event.request_id, event.worker)
            if windows:
                tracker.on_dispatch(ts, event.request_id)
            if event.policy and event.policy != "unknown":
                state.incumbent = event.policy
        elif kind == "finish":
            found, done = core.finish(ts, event.request_id, event.output_tokens, event.reason)
            if done is not None and windows:
                natural = event.reason in NATURAL_FINISH
                tracker.on_finish(ts, event.request_id, event.output_tokens, natural)
            if audit:
                stream.append(
                    (kind, ts, fleet, event.request_id, event.output_tokens, event.reason)
                )
        elif kind == "ready":
            found, ready = core.ready(ts, event.request_id, event.prompt_tokens, event.prompt_hash)
            if ready is not None and windows:
                tracker.on_ready(ts, event.request_id)
            if audit:
                stream.append(
                    (kind, ts, fleet, event.request_id, event.prompt_tokens, event.prompt_hash)
                )
        else:
            found = core.worker(ts, event.worker, event.capacity, event.state)
            if audit:
                stream.append((kind, ts, fleet, event.worker, event.capacity, event.state))
        if derive and found:
            violations.extend((ingest_id, v) for v in found)

    # -- engine scrapes -------------------------------------------------------------

    def record_engine_sample(self, fleet: str, worker: str, ts: float, sample: Any) -> None:
        """A scrape of one engine's `/metrics` (running, waiting, kv_usage, ...). It is
        compared with the mirror once the applied stream has reached its time. Lock-free:
        the poller calls it from the event loop."""
        self._incoming_samples.put((fleet, ts, worker, sample))

    def _check_samples(self, state: FleetState, violations: list, batch: EventBatch) -> None:
        """Compare the scrapes the applied stream has caught up with (never an older
        mirror against a newer scrape)."""
        pending = state.pending_samples
        while pending and pending[0][0] <= state.mirror.now:
            ts, worker, sample = heapq.heappop(pending)
            current = state.mirror.workers.get(worker)
            active = len(current.active) if current is not None else 0
            state.last_sample[worker] = (ts, float(sample.running), active)
            batch.samples.append(
                (state.fleet, worker, ts, float(sample.running), float(sample.waiting),
                 sample.kv_usage, sample.generation_tokens, active)
            )  # fmt: skip
            found = state.checker.on_engine_sample(state.mirror, ts, worker, sample.running)
            violations.extend((self._next_id - 1, v) for v in found)

    # -- windows and the step model --------------------------------------------------

    def step_model(self, state: FleetState) -> tuple[StepModel, bool]:
        """The fleet's calibrated step model, refitted from its engine steps."""
        samples = state.step_samples
        if not samples:
            return self.config.default_step_model, False
        array = np.array(samples, dtype=np.float64)
        steps = array[:, 0].astype(np.int64)
        order = np.argsort(steps, kind="stable")
        steps, array = steps[order], array[order]
        starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
        max_kv = np.maximum.reduceat(array[:, 1], starts)
        duration = np.maximum.reduceat(array[:, 2], starts)
        ts = np.maximum.reduceat(array[:, 3], starts)
        fit = fit_step_model(
            max_kv, duration, ts=ts, min_samples=self.config.step_fit_min_samples,
            default=self.config.default_step_model,
        )  # fmt: skip
        state.fit = fit
        self.store.save_fit(state.fleet, state.mirror.now, fit)
        return fit.as_step_model(), not fit.fallback

    def _schedule_windows(self, *, close: bool = False) -> None:
        for state in self.fleets.values():
            tracker = state.tracker
            if close and tracker.current is not None and tracker.current.t_end is None:
                tracker.close(state.mirror.now)
            due = tracker.due(state.mirror.now)
            if not due:
                continue
            fresh = [i for i in due if i not in state.stored_windows]
            for index in due:
                if index in state.stored_windows:
                    tracker.discard(index)
            if not fresh:
                continue
            model, fitted = self.step_model(state)
            for index in fresh:
                spec = tracker.spec(index, model)
                if self.executor is None:
                    try:
                        result = evaluate_window(spec)
                    except Exception:
                        self._window_failed(state, index)
                    else:
                        self._store_window(state, result, fitted)
                else:
                    future = self.executor.submit(evaluate_window, spec)
                    future.fitted = fitted  # type: ignore[attr-defined]
                    future.index = index  # type: ignore[attr-defined]
                    self._pending_windows.append((state, future))
        self.collect_windows()

    def collect_windows(self, wait: bool = False) -> int:
        """Store finished window evaluations (all of them with `wait`)."""
        stored = 0
        keep = []
        for state, future in self._pending_windows:
            if wait or future.done():
                try:
                    result = future.result()
                except Exception:
                    self._window_failed(state, future.index)  # type: ignore[attr-defined]
                else:
                    self._store_window(state, result, future.fitted)  # type: ignore[attr-defined]
                    stored += 1
            else:
                keep.append((state, future))
        self._pending_windows = keep
        return stored

    def _window_failed(self, state: FleetState, index: int) -> None:
        """A window that cannot be replayed is logged and counted; ingest goes on."""
        state.window_failures += 1
        log.exception("fleet %s: window %d could not be replayed", state.fleet, index)

    def _store_window(self, state: FleetState, result: WindowResult, fitted: bool) -> None:
        self.store.save_window(result, fitted)
        state.stored_windows.add(result.index)
        self.windows_evaluated += 1
        if self.on_window is not None:
            try:
                self.on_window(state, result)
            except Exception:
                log.exception("fleet %s: judging window %d failed", state.fleet, result.index)

    def close_idle_windows(self) -> None:
        """End the open window of every fleet with nothing running or waiting: a quiet
        fleet is a clean cut, and its last window can then be evaluated."""
        with self.lock:
            for state in self.fleets.values():
                mirror = state.mirror
                if not mirror.pool and not any(w.active for w in mirror.order):
                    state.tracker.close(mirror.now)
            if self.config.windows_enabled:
                self._schedule_windows()

    def finish(self) -> None:
        """End of input: apply everything, close the open windows, evaluate what is due."""
        with self.lock:
            self._wait(self._release(float("inf")))
            self.flush_audits()
            if self.config.windows_enabled:
                self._schedule_windows(close=True)
                self.collect_windows(wait=True)


def _lifecycle_row(ingest_id: int, event: Any) -> tuple:
    kind = event.type

    def get(name: str) -> Any:
        return getattr(event, name, None)  # events have slots: only their kind's fields

    view = get("router_view")
    if view is not None:
        view = json.dumps(
            {k: {f: x for f, x in struct_fields(v).items() if x is not None}
             if isinstance(v, RouterView) else v
             for k, v in view.items()},
            separators=(",", ":"),
        )  # fmt: skip
    return (
        ingest_id, event.fleet, event.source, event.seq, kind, event.ts, get("request_id"),
        get("worker"), get("prompt_tokens"), get("prompt_hash"), get("max_tokens"),
        get("policy"), view, get("output_tokens"), get("reason"), get("capacity"),
        get("state"),
    )  # fmt: skip


def _stored_event(kind: str, fields: dict[str, Any]) -> Any:
    """A stored row as an event-like object for the apply path."""
    event = SimpleNamespace(**fields)
    event.type = kind
    if kind == "dispatch":
        event.router_view = json.loads(fields["router_view"]) if fields.get("router_view") else None
    return event
