"""A fleet's mirror and its invariants, applied one event at a time.

The ingest pipeline and the audit follower (which keeps a replica of the mirror in a
worker process) both apply the stream through this class, so their mirrors stay equal
event for event, ghost releases included: the pipeline calls the per-kind methods with
the parsed event's fields, the follower hands over the `StreamItem`s the pipeline made
of them (`apply`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shadow.stream.invariants import InvariantChecker, InvariantConfig, Violation
from shadow.stream.items import (
    DispatchItem,
    EngineStepItem,
    FinishItem,
    ForgetItem,
    ProgressItem,
    ReadyItem,
    StreamItem,
    WorkerItem,
)
from shadow.stream.join import (
    CORRECTED,
    FINISHED,
    IGNORED,
    RECOMPUTE,
    RECOMPUTED,
    UNJOINED,
    UNKNOWN,
    FinishJoin,
    FinishOutcome,
    reason_label,
)
from shadow.stream.mirror import FleetMirror
from shadow.stream.mirror_records import Completed, RequestState, StepView


class FleetCore:
    """The mirror of one fleet with its invariant checks and periodic ghost sweeps."""

    def __init__(
        self,
        fleet: str,
        invariants: InvariantConfig | None = None,
        sweep_every_s: float = 5.0,
        *,
        checks: bool = True,
    ) -> None:
        """`checks=False`: a replica (the audit follower's) whose violations nobody reads,
        since the ingest path's own core reports them; it skips the checks that only
        report (they read the mirror, never change it) and keeps the ghost sweeps, which
        release requests and so change the state it must share with the ingest path."""
        self.fleet = fleet
        self.checks = checks
        self.mirror = FleetMirror(fleet)
        self.checker = InvariantChecker(fleet, invariants)
        self.join = FinishJoin()
        self.sweep_every_s = sweep_every_s
        self._next_sweep = 0.0
        #: item kind -> how it is applied: the one dispatch of the follower's path
        self._by_kind: dict[type[StreamItem], Callable[[Any], object]] = {
            WorkerItem: lambda i: self.worker(i.ts, i.worker, i.capacity, i.state),
            ReadyItem: lambda i: self.ready(i.ts, i.request_id, i.prompt_tokens, i.prompt_hash),
            DispatchItem: lambda i: self.dispatch(i.ts, i.request_id, i.worker),
            ProgressItem: lambda i: self.progress(i.ts, i.request_id, i.generated),
            FinishItem: lambda i: self.finish_event(
                i.ts, i.request_id, i.output_tokens, i.reason, i.estimated, i.from_engine
            ),
            EngineStepItem: lambda i: self.engine_step(
                i.ts, i.worker, i.step, i.running, i.duration_ms, i.waiting
            ),
            ForgetItem: lambda i: self.forget(i.before_ts),
        }

    def worker(self, ts: float, worker: str, capacity: int, state: str) -> list[Violation]:
        self.mirror.apply_worker(ts, worker, capacity, state)
        return self._sweep(ts)

    def ready(
        self, ts: float, request_id: str, prompt_tokens: int, prompt_hash: str | None
    ) -> tuple[list[Violation], RequestState | None]:
        request = self.mirror.apply_ready(ts, request_id, prompt_tokens, prompt_hash)
        if request is not None:
            self.join.note_request(request_id)
        return self._sweep(ts), request

    def dispatch(self, ts: float, request_id: str, worker: str) -> list[Violation]:
        found = (
            self.checker.before_dispatch(self.mirror, ts, request_id, worker) if self.checks else []
        )
        self.join.note_request(request_id)
        self.mirror.apply_dispatch(ts, request_id, worker)
        return found + self._sweep(ts)

    def progress(self, ts: float, request_id: str, generated: int) -> list[Violation]:
        found = (
            self.checker.before_progress(self.mirror, ts, request_id, generated)
            if self.checks
            else []
        )
        self.mirror.apply_progress(ts, request_id, generated)
        return found + self._sweep(ts)

    def finish(
        self, ts: float, request_id: str, output_tokens: int, reason: str
    ) -> tuple[list[Violation], Completed | None]:
        """A finish with nothing said of its count (`finish_event`)."""
        found, outcome = self.finish_event(ts, request_id, output_tokens, reason)
        return found, outcome.completed if outcome.kind == FINISHED else None

    def finish_event(
        self,
        ts: float,
        request_id: str,
        output_tokens: int,
        reason: str,
        estimated: bool | None = None,
        from_engine: bool | None = None,
        ref: int = -1,
    ) -> tuple[list[Violation], FinishOutcome]:
        """Apply one finish through the join (`shadow.stream.join`): the first finish of
        a request finishes it, a later exact count corrects an estimate, `recomputed`
        returns it to the pool. `ref` is the caller's id of this event (the ingest id),
        given back as `primary_ref` to the later finishes of the same request."""
        mirror = self.mirror
        engine = bool(from_engine)
        target = self.join.target(mirror, request_id, engine)
        if target is None:  # an engine finish for a request the shadow never saw (yet)
            mirror._tick(ts)
            self.join.unjoined += 1
            self.join.hold_early(request_id, output_tokens, ref)
            return self._sweep(ts), FinishOutcome(UNJOINED, request_id)
        request = mirror.requests.get(target)
        if reason == RECOMPUTED:
            back = mirror.apply_recompute(ts, target)
            if back is not None:
                self.join.reasons[RECOMPUTED] += 1
            kind = RECOMPUTE if back is not None else IGNORED
            return self._sweep(ts), FinishOutcome(kind, target)
        if request is not None and request.finished:
            mirror._tick(ts)
            later = self.join.later_finish(mirror, request, output_tokens, estimated is not True)
            return self._sweep(ts), later
        found = [] if engine or not self.checks else self.checker.before_finish(mirror, ts, target)
        done = mirror.apply_finish(
            ts, target, output_tokens, reason, estimated=estimated is True, ref=ref
        )
        if done is None:
            if engine:  # a stale engine finish of a forgotten request
                self.join.unjoined += 1
                return found + self._sweep(ts), FinishOutcome(UNJOINED, target)
            return found + self._sweep(ts), FinishOutcome(UNKNOWN, target)
        self.join.reasons[reason_label(reason)] += 1
        if estimated is True:
            self.join.estimates += 1
        early = None if engine else self.join.take_early(target)
        if early is not None:  # the engine's count came first, before the tap's events
            self.join.unjoined -= 1
            tokens, early_ref = early
            finished = mirror.requests.get(target)
            later = (
                self.join.later_finish(mirror, finished, tokens, True)
                if finished is not None
                else None
            )
            corrected = later is not None and later.kind == CORRECTED
            done = later.completed if corrected and later.completed is not None else done
            outcome = FinishOutcome(FINISHED, target, done, early_ref=early_ref,
                                    early_corrected=corrected)  # fmt: skip
            return found + self._sweep(ts), outcome
        return found + self._sweep(ts), FinishOutcome(FINISHED, target, done)

    def engine_step(
        self,
        ts: float,
        worker: str,
        step: int,
        running: int,
        duration_ms: float,
        waiting: int = 0,
    ) -> tuple[list[Violation], StepView | None]:
        """Count the step; compare what the engine ran (and held waiting) with what the
        mirror expected."""
        view = self.mirror.apply_engine_step(ts, worker, step, ts - duration_ms / 1000.0, running)
        found = []
        if view is not None and self.checks:
            # the view already leaves out the dispatched requests the engine has not
            # started (they are in its waiting queue): excuse only the waiting beyond them
            held_back = len(self.mirror.workers[worker].starting)
            found = self.checker.on_engine_step(
                ts, worker, view.running, running, max(0, waiting - held_back)
            )
        return found + self._sweep(ts), view

    def forget(self, before_ts: float) -> int:
        """Drop requests finished before `before_ts` (`FleetMirror.forget_finished`); the
        owner sends a `ForgetItem` down the stream too, so that a
        follower's replica forgets at the same point."""
        self.checker.forget(before_ts)
        forgotten = self.mirror.forget_finished(before_ts)
        if forgotten and self.join.children:
            self.join.forget(self.mirror)
        return forgotten

    def _sweep(self, ts: float) -> list[Violation]:
        if ts < self._next_sweep:
            return []
        self._next_sweep = ts + self.sweep_every_s
        return self.checker.sweep_ghosts(self.mirror)

    def apply(self, item: StreamItem) -> None:
        """Apply one stream item (the follower's path), by its kind."""
        self._by_kind[item.__class__](item)
