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
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from analysis.stepmodel import StepModelFit, fit_step_model
from ingest.events import EventError
from shadow.audit import (
    AuditConfig,
    AuditEngine,
    AuditJob,
    AuditOutcome,
    Decision,
    LearnJob,
    run_in_worker,
)
from shadow.invariants import InvariantChecker, InvariantConfig, Violation
from shadow.mirror import NATURAL_FINISH, FleetMirror
from shadow.policies.snapshot import NO_KEY
from shadow.service.store import EventBatch, ServiceStore
from shadow.windows import WindowConfig, WindowResult, WindowTracker, evaluate_window
from shadow.workload import StepModel

ORDER = {"worker": 0, "engine_step": 1, "progress": 2, "finish": 3, "ready": 4, "dispatch": 5}
LIFECYCLE = frozenset({"worker", "ready", "dispatch", "finish"})


@dataclass(frozen=True)
class PipelineConfig:
    reorder_window_s: float = 2.0
    seq_window: int = 1_000_000
    ghost_sweep_every_s: float = 5.0
    audit_enabled: bool = True
    windows_enabled: bool = True
    step_fit_min_samples: int = 50
    default_step_model: StepModel = field(default_factory=StepModel)
    audit: AuditConfig = field(default_factory=AuditConfig)
    invariants: InvariantConfig = field(default_factory=InvariantConfig)
    windows: WindowConfig = field(default_factory=WindowConfig)


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


class _RecentInts:
    """Integers seen (seqs, steps), exact within `window` of the highest.

    Sources count up, so it keeps the highest value and the gaps below it rather than
    every value: the common case is one comparison and no set operation.
    """

    __slots__ = ("gaps", "high", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.high = -1
        self.gaps: set[int] = set()

    def add(self, value: int) -> bool:
        """Record `value`; False when it was seen (or is too old to tell, so presumed)."""
        high = self.high
        if value == high + 1:
            self.high = value
            return True
        if value > high:
            floor = max(high + 1, value - self.window)
            self.gaps.update(range(floor, value))
            self.high = value
            if len(self.gaps) > self.window:
                self.gaps = {v for v in self.gaps if v > value - self.window}
            return True
        if value in self.gaps:
            self.gaps.discard(value)
            return True
        return False

    def seed(self, values: set[int]) -> None:
        """Restore from stored values: everything below the lowest counts as seen."""
        if values:
            low, self.high = min(values), max(values)
            self.gaps = set(range(low, self.high + 1)) - values


class FleetState:
    """Everything the service knows of one fleet."""

    def __init__(self, fleet: str, config: PipelineConfig) -> None:
        self.fleet = fleet
        self.mirror = FleetMirror(fleet)
        self.checker = InvariantChecker(fleet, config.invariants)
        self.learned: list[int] = []  # completed lengths the audit has not learned yet
        self.tracker = WindowTracker(fleet, self.mirror, config.windows)
        self.step_samples: list[tuple[int, int, float, float]] = []  # step, kv, ms, ts
        self.fit: StepModelFit | None = None
        self.load_mismatches = 0
        self.engine_steps = 0
        self.late_events = 0
        self.incumbent = "jsq"
        self.next_sweep = 0.0
        self.stored_windows: set[int] = set()


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
        self._audit_engine = AuditEngine(self.config.audit)
        self._audit_done: list[AuditOutcome] = []
        self._audit_pending: list[tuple[float, Future[list[AuditOutcome]]]] = []
        self.fleets: dict[str, FleetState] = {}
        self.lock = threading.RLock()
        self._buffer: list[tuple[float, int, int, Any]] = []
        self._max_ts = float("-inf")
        self._last_applied: tuple[float, int] = (float("-inf"), -1)
        self._next_id = 1
        self._seqs: dict[tuple[str, str], _RecentInts] = {}
        self._steps_seen: dict[tuple[str, str], _RecentInts] = {}
        self._progress_seen: dict[tuple[str, str], int] = {}
        self._pending_windows: list[tuple[FleetState, Future[WindowResult]]] = []
        self.windows_evaluated = 0
        #: Set when a commit failed after the batch was applied in memory; the owner must
        #: build a new pipeline from the database (`start`) before submitting more.
        self.broken = False

    # -- start-up -------------------------------------------------------------------

    def start(self) -> int:
        """Rebuild state from the database; returns how many stored events were applied."""
        with self.lock:
            applied_through = self.store.state("applied_through", 0)
            self._next_id = self.store.state("next_ingest_id", 1)
            self.store.drop_derived_after(applied_through)
            for fleet, indices in self.store.window_indices().items():
                self._fleet(fleet).stored_windows |= indices
            for (fleet, source), seqs in self.store.recent_seqs(self.config.seq_window).items():
                self._seq_memory(fleet, source).seed(seqs)
            count = 0
            violations: list[tuple[int, Violation]] = []
            jobs: list[AuditJob | LearnJob] = []
            for ts, _, ingest_id, kind, fields in self.store.stored_events():
                event = _stored_event(kind, fields)
                if kind == "engine_step":
                    self._steps_memory(event.fleet, event.worker).add(event.step)
                elif kind == "progress":
                    self._progress_seen[(event.fleet, event.request_id)] = event.generated
                derive = ingest_id > applied_through
                self._apply(event, ingest_id, violations, jobs, derive=derive)
                self._last_applied = (ts, ORDER[kind])
                self._max_ts = max(self._max_ts, ts)
                count += 1
            self._audit(jobs)
            decisions, audited = self._collect_audits(wait=True)
            self.store.commit(
                EventBatch(), self._next_id, decisions, violations + audited, self._checkpoint()
            )
            return count

    # -- receipt --------------------------------------------------------------------

    def _seq_memory(self, fleet: str, source: str) -> _RecentInts:
        memory = self._seqs.get((fleet, source))
        if memory is None:
            memory = self._seqs[(fleet, source)] = _RecentInts(self.config.seq_window)
        return memory

    def _steps_memory(self, fleet: str, worker: str) -> _RecentInts:
        memory = self._steps_seen.get((fleet, worker))
        if memory is None:
            memory = self._steps_seen[(fleet, worker)] = _RecentInts(100_000)
        return memory

    def submit(
        self, events: Iterable[tuple[int, Any]], errors: Sequence[EventError] = ()
    ) -> IngestResult:
        """Store a validated batch durably, then apply what the reorder window releases.

        Returns once the batch is committed: what it counts as accepted is acknowledged.
        """
        result = IngestResult(rejected=len(errors), errors=list(errors))
        with self.lock:
            if self.broken:
                raise RuntimeError(
                    "the ingest pipeline lost a commit; restart it from the database"
                )
            batch = EventBatch()
            fresh: list[tuple[float, int, int, Any]] = []
            next_id = self._next_id
            for _, event in events:
                if not self._is_new(event):
                    result.duplicates += 1
                    continue
                ingest_id = next_id
                next_id += 1
                kind = event.type
                if kind in LIFECYCLE:
                    batch.lifecycle.append(_lifecycle_row(ingest_id, event))
                elif kind == "engine_step":
                    batch.steps.append(
                        (
                            ingest_id,
                            event.fleet,
                            event.source,
                            event.seq,
                            event.worker,
                            event.step,
                            event.ts,
                            event.duration_ms,
                            event.running,
                            event.kv_tokens,
                            event.waiting,
                        )
                    )
                else:
                    key = (event.fleet, event.request_id)
                    if self._progress_seen.get(key, -1) < event.generated:
                        self._progress_seen[key] = event.generated
                        batch.progress[key] = (*key, event.generated, event.ts, ingest_id)
                fresh.append((event.ts, ORDER[kind], ingest_id, event))
                result.accepted += 1
            if fresh:
                self._next_id = next_id
                for entry in fresh:
                    heapq.heappush(self._buffer, entry)
                    if entry[0] > self._max_ts:
                        self._max_ts = entry[0]
                self._release(self._max_ts - self.config.reorder_window_s, batch)
        return result

    def _is_new(self, event: Any) -> bool:
        if event.seq is not None and not self._seq_memory(event.fleet, event.source).add(event.seq):
            return False
        kind = event.type
        if kind == "progress":
            return self._progress_seen.get((event.fleet, event.request_id), -1) != event.generated
        if kind == "engine_step":
            return self._steps_memory(event.fleet, event.worker).add(event.step)
        return True

    # -- apply ----------------------------------------------------------------------

    def drain(self) -> None:
        """Apply everything buffered (end of a file, an idle stream, shutdown)."""
        with self.lock:
            self._release(float("inf"))
            self.flush_audits()

    def _release(self, upto: float, batch: EventBatch | None = None) -> None:
        """Apply buffered events up to `upto`, then commit `batch` (the events being
        acknowledged) with everything derived, in one transaction."""
        violations: list[tuple[int, Violation]] = []
        jobs: list[AuditJob | LearnJob] = []
        buffer = self._buffer
        applied = 0
        while buffer and buffer[0][0] <= upto:
            ts, order, ingest_id, event = heapq.heappop(buffer)
            if (ts, order) < self._last_applied:
                self._fleet(event.fleet).late_events += 1
            else:
                self._last_applied = (ts, order)
            self._apply(event, ingest_id, violations, jobs, derive=True)
            applied += 1
        self._audit(jobs)
        decisions, audited = self._collect_audits()
        if batch is not None or applied or decisions:
            try:
                self.store.commit(
                    batch or EventBatch(),
                    self._next_id,
                    decisions,
                    violations + audited,
                    self._checkpoint(),
                )
            except BaseException:
                self.broken = True  # memory ran ahead of the database: rebuild before more
                raise
        if applied and self.config.windows_enabled:
            self._schedule_windows()

    def _checkpoint(self) -> int:
        """The highest ingest id through which every event is applied and audited."""
        through = self._next_id - 1
        if self._buffer:
            through = min(through, min(e[2] for e in self._buffer) - 1)
        for first, _ in self._audit_pending:  # batches of learning only have no first id
            if first != float("inf"):
                through = min(through, int(first) - 1)
                break
        return through

    # -- the decision audit ---------------------------------------------------------

    def _audit(self, jobs: list[AuditJob | LearnJob]) -> None:
        if not jobs:
            return
        if self.audit_executor is None:
            self._audit_done.extend(self._audit_engine.run(jobs))
            return
        first = min((j.ingest_id for j in jobs if isinstance(j, AuditJob)), default=None)
        future = self.audit_executor.submit(run_in_worker, jobs)
        self._audit_pending.append((first if first is not None else float("inf"), future))

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
                self.store.commit(
                    EventBatch(), self._next_id, decisions, violations, self._checkpoint()
                )

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
        jobs: list[AuditJob | LearnJob],
        *,
        derive: bool,
    ) -> None:
        state = self._fleet(event.fleet)
        mirror, checker = state.mirror, state.checker
        kind, ts = event.type, event.ts
        windows = self.config.windows_enabled
        if windows:
            state.tracker.before_event(kind, ts)
        found: list[Violation] = []
        if kind == "engine_step":
            worker = mirror.workers.get(event.worker)
            load = worker.load if worker is not None else 0
            kv = event.kv_tokens if event.kv_tokens is not None else load
            if event.kv_tokens is not None and event.kv_tokens != load:
                state.load_mismatches += 1
            found = checker.on_engine_step(mirror, ts, event.worker, event.running)
            if mirror.apply_engine_step(ts, event.worker, event.step) is not None:
                state.engine_steps += 1
                if windows:
                    state.tracker.on_engine_step(
                        ts, event.worker, event.step, event.duration_ms, event.running, kv
                    )
                state.step_samples.append((event.step, kv, event.duration_ms, ts))
        elif kind == "progress":
            found = checker.before_progress(mirror, ts, event.request_id, event.generated)
            mirror.apply_progress(ts, event.request_id, event.generated)
            info = state.tracker.requests.get(event.request_id) if windows else None
            if info is not None:
                info.progress = max(info.progress, event.generated)
        elif kind == "dispatch":
            found = checker.before_dispatch(mirror, ts, event.request_id, event.worker)
            request = mirror.requests.get(event.request_id)
            first = request is None or (request.worker is None and not request.finished)
            if derive and first and self.config.audit_enabled and event.worker in mirror.workers:
                if state.learned:
                    jobs.append(LearnJob(state.fleet, tuple(state.learned)))
                    state.learned.clear()
                view = event.router_view
                if view is not None:
                    view = {
                        k: v.model_dump() if hasattr(v, "model_dump") else v
                        for k, v in view.items()
                    }
                jobs.append(
                    AuditJob(
                        ingest_id,
                        state.fleet,
                        ts,
                        event.request_id,
                        request.prompt_tokens if request is not None else 0,
                        request.prompt_key if request is not None else int(NO_KEY),
                        event.worker,
                        event.policy,
                        view,
                        mirror.snapshot(),
                    )
                )
            mirror.apply_dispatch(ts, event.request_id, event.worker)
            if windows:
                state.tracker.on_dispatch(ts, event.request_id)
            if event.policy and event.policy != "unknown":
                state.incumbent = event.policy
        elif kind == "finish":
            found = checker.before_finish(mirror, ts, event.request_id)
            done = mirror.apply_finish(ts, event.request_id, event.output_tokens, event.reason)
            if done is not None:
                natural = event.reason in NATURAL_FINISH
                if windows:
                    state.tracker.on_finish(ts, event.request_id, event.output_tokens, natural)
                if natural and event.output_tokens >= 1 and self.config.audit_enabled:
                    state.learned.append(event.output_tokens)
        elif kind == "ready":
            ready = mirror.apply_ready(ts, event.request_id, event.prompt_tokens, event.prompt_hash)
            if ready is not None and windows:
                state.tracker.on_ready(ts, event.request_id)
        else:
            mirror.apply_worker(ts, event.worker, event.capacity, event.state)
        if ts >= state.next_sweep:
            found += checker.sweep_ghosts(mirror)
            state.next_sweep = ts + self.config.ghost_sweep_every_s
        if derive and found:
            violations.extend((ingest_id, v) for v in found)

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
                    self._store_window(state, evaluate_window(spec), fitted)
                else:
                    future = self.executor.submit(evaluate_window, spec)
                    future.fitted = fitted  # type: ignore[attr-defined]
                    self._pending_windows.append((state, future))
        self.collect_windows()

    def collect_windows(self, wait: bool = False) -> int:
        """Store finished window evaluations (all of them with `wait`)."""
        stored = 0
        keep = []
        for state, future in self._pending_windows:
            if wait or future.done():
                self._store_window(state, future.result(), future.fitted)  # type: ignore[attr-defined]
                stored += 1
            else:
                keep.append((state, future))
        self._pending_windows = keep
        return stored

    def _store_window(self, state: FleetState, result: WindowResult, fitted: bool) -> None:
        self.store.save_window(result, fitted)
        state.stored_windows.add(result.index)
        self.windows_evaluated += 1

    def finish(self) -> None:
        """End of input: apply everything, close the open windows, evaluate what is due."""
        with self.lock:
            self._release(float("inf"))
            self.flush_audits()
            if self.config.windows_enabled:
                self._schedule_windows(close=True)
                self.collect_windows(wait=True)


def _lifecycle_row(ingest_id: int, event: Any) -> tuple:
    kind = event.type
    get = event.__dict__.get
    view = get("router_view")
    if view is not None:
        view = json.dumps(
            {k: v.model_dump(exclude_none=True) if hasattr(v, "model_dump") else v
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
