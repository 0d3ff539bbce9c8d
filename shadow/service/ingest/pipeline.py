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
import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from operator import itemgetter
from typing import Any

from shadow.events import EVENT_ORDER, EventError
from shadow.replay.workload import StepModel
from shadow.service.ingest.apply import Applier, FleetState
from shadow.service.ingest.audits import AuditHandoff
from shadow.service.ingest.committer import CommitJob, GroupCommitter
from shadow.service.ingest.config import BOUNDS, IngestResult, Limits, PipelineConfig
from shadow.service.ingest.progress_seen import ProgressSeen
from shadow.service.ingest.reorder import Entry, ReorderBuffer
from shadow.service.ingest.rows import lifecycle_row, stored_event
from shadow.service.ingest.seen import RecentInts
from shadow.service.ingest.source_clocks import SourceClocks
from shadow.service.ingest.windows import WindowScheduler
from shadow.service.store import EventBatch, ServiceStore
from shadow.stream.invariants import Violation
from shadow.stream.items import ForgetItem, StreamItem
from shadow.stream.windows import WindowResult

__all__ = ["BOUNDS", "FleetState", "IngestResult", "Limits", "Pipeline", "PipelineConfig"]

log = logging.getLogger(__name__)
MAX_PENDING_SAMPLES = 1000
#: how often the progress log is folded into `progress_latest` (see migration 0008)
PROGRESS_FOLD_EVERY_S = 5.0
#: before every (ts, class order): a fleet with nothing applied yet
_BEFORE_ALL = (-math.inf, -1)


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
        self._incoming_samples: queue.SimpleQueue[tuple[str, float, str, Any]] = queue.SimpleQueue()
        self.lock = threading.RLock()
        self._buffer = ReorderBuffer()
        self._max_ts = float("-inf")
        self._clocks = SourceClocks(
            self.config.reorder_window_s, self.config.source_wait_s,
            self.config.source_max_lag_s,
        )  # fmt: skip
        #: per fleet, the (ts, class order) of the last event applied in order
        self._last_applied: dict[str, tuple[float, int]] = {}
        #: events through this ingest id had their decisions and violations stored before
        #: a restart: applied again from the reorder window, they derive nothing again
        self._derived_through = 0
        self._next_id = 1
        self._seqs: dict[tuple[str, str], RecentInts] = {}
        self._steps_seen: dict[tuple[str, str], RecentInts] = {}
        self.fleets: dict[str, FleetState] = {}
        #: the progress de-duplication memory (finished requests' counts in the mirrors)
        self._progress_seen = ProgressSeen(self.fleets)
        #: (fleet, event type, accepted|duplicate) -> events, for /metrics
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.rejected = 0
        #: bound name (BOUNDS) -> times it was hit, for /metrics
        self.bound_hits: Counter[str] = Counter({name: 0 for name in BOUNDS})
        self._admitted_workers: dict[str, set[str]] = {}
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
        self._applier = Applier(self.config, self._fleet)
        self._audits = AuditHandoff(self.config, audit_executor, self._fleet, self.bound_hits)
        self._windows = WindowScheduler(store, self.config, executor, self.fleets)

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
            # Stored events come in apply order: from the first one held, every later one
            # is held too, though applied before the stop (its id within `applied_through`)
            # when a straggler came in time. Applying such a one now would put it before
            # the held earlier one, where the stop found them the other way round.
            first_held = next(
                (
                    position
                    for position, (ts, _, ingest_id, _, _) in enumerate(stored)
                    if ingest_id > applied_through and ts > hold_after
                ),
                len(stored),
            )
            self._derived_through = applied_through
            held: list[Entry] = []
            for position, (ts, _, ingest_id, kind, fields) in enumerate(stored):
                event = stored_event(kind, fields)
                if kind == "engine_step":
                    self._steps_memory(event.fleet, event.worker).add(event.step)
                elif kind == "progress":
                    self._progress_seen.restore((event.fleet, event.request_id), event.generated)
                elif kind == "worker":
                    self._admitted_workers.setdefault(event.fleet, set()).add(event.worker)
                self._admitted_workers.setdefault(event.fleet, set())
                self._max_ts = max(self._max_ts, ts)
                count += 1
                if position >= first_held:
                    held.append((ts, EVENT_ORDER[kind], ingest_id, event))
                    continue
                derive = ingest_id > applied_through
                self._apply(event, ingest_id, violations, stream, derive=derive)
                self._last_applied[event.fleet] = (ts, EVENT_ORDER[kind])
            # in id order, as ingest pushes: the buffer then finds its lowest id without a
            # scan for as long as this process runs (`ReorderBuffer.lowest_id`)
            now = time.monotonic()
            for entry in sorted(held, key=itemgetter(2)):
                self._buffer.push(entry)
                self._clocks.saw(entry[3].fleet, entry[3].source, entry[0], now)
            self._forget_finished_progress()
            self._forget_finished(stream)
            self._audits.submit(stream)
            decisions, audited = self._audits.collect(wait=True)
            # the join's changes to stored finish rows again: the same, or, where the
            # stored order differs from the applied one, what this order derives
            rebuilt = EventBatch()
            self._applier.take_finish_updates(rebuilt)
            self.committer.submit(
                rebuilt, self._next_id, decisions, violations + audited, self._checkpoint()
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
                fresh: list[Entry] = []
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
                                event.tokens,
                            )
                        )
                    elif kind == "progress":
                        key = (fleet, event.request_id)
                        if seen_progress.raise_to(key, event.generated):
                            progress[key] = (*key, event.generated, event.ts, ingest_id)
                    else:
                        lifecycle.append(lifecycle_row(ingest_id, event))
                    fresh.append((event.ts, EVENT_ORDER[kind], ingest_id, event))
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
                    clocks, now = self._clocks, time.monotonic()
                    clocks.batch(now)
                    push = self._buffer.push
                    # each source's newest event, taken per run of one (fleet, source):
                    # a batch is nearly always one run
                    run_fleet = run_source = None
                    newest = -math.inf
                    for entry in fresh:
                        push(entry)
                        event = entry[3]
                        fleet, source = event.fleet, event.source
                        if fleet == run_fleet and source == run_source:
                            if entry[0] > newest:
                                newest = entry[0]
                            continue
                        if run_fleet is not None:
                            clocks.saw(run_fleet, run_source, newest, now)
                            self._max_ts = max(self._max_ts, newest)
                        run_fleet, run_source, newest = fleet, source, entry[0]
                    clocks.saw(run_fleet, run_source, newest, now)
                    self._max_ts = max(self._max_ts, newest)
                    upto = clocks.release_points(now)
                    if len(self._buffer) > self.config.limits.max_reorder_events:
                        self.bound_hits["reorder_buffer"] += 1
                        upto = clocks.newest()  # apply what is held now rather than hold more
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
                held = len(mirror.pool) + mirror.running
                if held >= limits.max_active_per_fleet:
                    return ("active_per_fleet", "request_id", f"fleet {fleet!r} holds "
                            f"max_active_per_fleet ({limits.max_active_per_fleet}) ready or "
                            "running requests")  # fmt: skip
        return None

    def _forget_finished_progress(self) -> None:
        """Progress dedupe memory of requests finished `finished_ttl_s` ago goes (the
        mirrors forget the finished requests they hold, and their counts, themselves)."""
        self._progress_seen.forget(self._max_ts - self.config.limits.finished_ttl_s)

    def _forget_finished(self, stream: list[StreamItem]) -> None:
        """Finished requests leave the mirrors `finished_ttl_s` (fleet time) after they
        finished; the audit follower's replica forgets at the same point of the stream."""
        for state in self.fleets.values():
            before = state.mirror.now - self.config.limits.finished_ttl_s
            if before > state.mirror.forgotten_before:
                state.core.forget(before)
                if self.config.audit_enabled:
                    stream.append(ForgetItem(state.mirror.now, state.fleet, before))

    def _is_new(self, event: Any, kind: str, memory: RecentInts | None) -> bool:
        """Whether an event not seen by its seq (`memory` holds its source's seqs, None
        without a seq) is new by its content: progress ahead, an engine step not counted."""
        if kind == "progress":
            seen = self._progress_seen.get((event.fleet, event.request_id))
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

    def sources(self, fleet: str) -> list[str]:
        """The senders of `fleet` the release keeps track of (`SourceClocks`)."""
        return self._clocks.sources(fleet)

    def drain(self, wait_for_sources: bool = False) -> None:
        """Apply everything buffered (end of a file, a flush, shutdown). With
        `wait_for_sources` (a stream gone quiet for a moment, which may be a stall),
        each fleet only up to where its live sources got (`SourceClocks`): what one
        source sent ahead of another still waits for the other's."""
        with self.lock:
            upto: float | dict[str, float] = float("inf")
            if wait_for_sources:
                upto = self._clocks.release_points(time.monotonic(), window_s=0.0)
            self._wait(self._release(upto))
            self.flush_audits()

    def _apply(
        self,
        event: Any,
        ingest_id: int,
        violations: list[tuple[int, Violation]],
        stream: list[StreamItem],
        *,
        derive: bool,
    ) -> None:
        """Apply one event; a finish hands its request's progress count to the mirror."""
        self._applier.apply(event, ingest_id, violations, stream, derive=derive)
        if event.type == "finish":
            self._progress_seen.finished((event.fleet, event.request_id), event.ts)

    def _release(
        self, upto: float | Mapping[str, float], batch: EventBatch | None = None
    ) -> CommitJob | None:
        """Apply buffered events up to `upto` (one time, or each fleet's), then queue
        `batch` (the events being acknowledged) with everything derived for one
        transaction; the caller waits for it to commit (None: nothing to write)."""
        violations: list[tuple[int, Violation]] = []
        stream: list[StreamItem] = []
        applied = 0
        last_applied = self._last_applied
        run_fleet = None  # the fleet of the events being applied, and its last in order
        last = _BEFORE_ALL
        for ts, order, ingest_id, event in self._buffer.pop_until(upto):
            fleet = event.fleet
            if fleet != run_fleet:
                if run_fleet is not None:
                    last_applied[run_fleet] = last
                run_fleet, last = fleet, last_applied.get(fleet, _BEFORE_ALL)
            if (ts, order) < last:
                state = self._fleet(fleet)
                state.late_events += 1
                state.late_by_source[(event.source, event.type)] += 1
            else:
                last = (ts, order)
            self._apply(
                event, ingest_id, violations, stream, derive=ingest_id > self._derived_through
            )
            applied += 1
        if run_fleet is not None:
            last_applied[run_fleet] = last
        if applied:
            self._forget_finished(stream)
        self._audits.submit(stream)
        decisions, audited = self._audits.collect()
        if self.config.audit_sampling:
            high = max(2, self.config.limits.max_audit_backlog // 2)
            for state in self.fleets.values():
                state.sampler.adapt(self._audits.backlog, high)
        batch = batch if batch is not None else EventBatch()
        self._applier.take_finish_updates(batch)
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
            self._windows.schedule()
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
        first = self._audits.first_pending_id()
        if first is not None:
            through = min(through, first - 1)
        return through

    # -- the decision audit (see `audits.AuditHandoff`) -----------------------------

    @property
    def audit_backlog(self) -> int:
        """Batches handed to the audit worker whose decisions are not collected yet: a
        backlog that keeps growing means the worker cannot keep up with ingest."""
        return self._audits.backlog

    @property
    def audit_lag_s(self) -> float:
        """Seconds of fleet time the audit is behind the applied stream (0: caught up)."""
        return self._audits.lag_s

    def flush_audits(self) -> None:
        """Wait for every audit in flight and store its decisions."""
        with self.lock:
            decisions, violations = self._audits.collect(wait=True)
            if decisions or violations:
                self.committer.submit(
                    EventBatch(), self._next_id, decisions, violations, self._checkpoint()
                ).wait()

    def _fleet(self, fleet: str) -> FleetState:
        state = self.fleets.get(fleet)
        if state is None:
            state = self.fleets[fleet] = FleetState(fleet, self.config)
        return state

    # -- engine scrapes -------------------------------------------------------------

    def record_engine_sample(self, fleet: str, worker: str, ts: float, sample: Any) -> None:
        """A scrape of one engine's `/metrics` (a poller `EngineSample`: running, waiting
        and its split by reason, preemptions, kv_usage, ...). It is compared with the
        mirror once the applied stream has reached its time. Lock-free: the poller calls
        it from the event loop."""
        self._incoming_samples.put((fleet, ts, worker, sample))

    def _check_samples(self, state: FleetState, violations: list, batch: EventBatch) -> None:
        """Compare the scrapes the applied stream has caught up with (never an older
        mirror against a newer scrape)."""
        pending = state.pending_samples
        while pending and pending[0][0] <= state.mirror.now:
            ts, worker, sample = heapq.heappop(pending)
            current = state.mirror.workers.get(worker)
            active = 0
            if current is not None:  # the count at the scrape's time, not the mirror's now
                at_ts = current.active_history.between(ts, ts, len(current.active))
                active = at_ts[1] if at_ts is not None else len(current.active)
            state.last_sample[worker] = (ts, float(sample.running), active)
            batch.samples.append(
                (state.fleet, worker, ts, float(sample.running), float(sample.waiting),
                 sample.kv_usage, sample.generation_tokens, active)
            )  # fmt: skip
            found = state.checker.on_engine_sample(
                state.mirror,
                ts,
                worker,
                sample.running,
                deferred=sample.waiting_for("deferred"),
                capacity_waiting=sample.waiting_for("capacity"),
                preemptions=sample.preemptions,
                requested_at=getattr(sample, "requested_at", None),
            )
            violations.extend((self._next_id - 1, v) for v in found)

    # -- windows (see `windows.WindowScheduler`) -----------------------------------

    @property
    def on_window(self) -> Callable[[FleetState, WindowResult], None] | None:
        """Called with (fleet state, window result) after each stored window (the modes)."""
        return self._windows.on_window

    @on_window.setter
    def on_window(self, callback: Callable[[FleetState, WindowResult], None] | None) -> None:
        self._windows.on_window = callback

    @property
    def windows_evaluated(self) -> int:
        return self._windows.windows_evaluated

    def step_model(self, state: FleetState) -> tuple[StepModel, bool]:
        """The fleet's calibrated step model, refitted from its engine steps."""
        return self._windows.step_model(state)

    def collect_windows(self, wait: bool = False) -> int:
        """Store finished window evaluations (all of them with `wait`)."""
        return self._windows.collect(wait)

    def close_idle_windows(self, final: bool = False) -> None:
        """End the open window of every fleet with nothing running or waiting: a quiet
        fleet is a clean cut, and its last window can then be evaluated. With `final`
        the caller says no arrival follows (a demo's or a test's traffic has stopped):
        that window is the evidence's last, and the continuous runs drain in it."""
        with self.lock:
            for state in self.fleets.values():
                mirror = state.mirror
                if not mirror.pool and not any(w.active for w in mirror.order):
                    state.tracker.close(mirror.now, final=final)
            if self.config.windows_enabled:
                self._windows.schedule()

    def finish(self) -> None:
        """End of input: apply everything, close the open windows, evaluate what is due."""
        with self.lock:
            self._wait(self._release(float("inf")))
            self.flush_audits()
            if self.config.windows_enabled:
                self._windows.schedule(close=True)
                self._windows.collect(wait=True)
