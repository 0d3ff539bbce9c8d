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
from shadow.stream.mirror import Completed, FleetMirror, RequestState, StepView


class FleetCore:
    """The mirror of one fleet with its invariant checks and periodic ghost sweeps."""

    def __init__(
        self, fleet: str, invariants: InvariantConfig | None = None, sweep_every_s: float = 5.0
    ) -> None:
        self.fleet = fleet
        self.mirror = FleetMirror(fleet)
        self.checker = InvariantChecker(fleet, invariants)
        self.sweep_every_s = sweep_every_s
        self._next_sweep = 0.0
        #: item kind -> how it is applied: the one dispatch of the follower's path
        self._by_kind: dict[type[StreamItem], Callable[[Any], object]] = {
            WorkerItem: lambda i: self.worker(i.ts, i.worker, i.capacity, i.state),
            ReadyItem: lambda i: self.ready(i.ts, i.request_id, i.prompt_tokens, i.prompt_hash),
            DispatchItem: lambda i: self.dispatch(i.ts, i.request_id, i.worker),
            ProgressItem: lambda i: self.progress(i.ts, i.request_id, i.generated),
            FinishItem: lambda i: self.finish(i.ts, i.request_id, i.output_tokens, i.reason),
            EngineStepItem: lambda i: self.engine_step(
                i.ts, i.worker, i.step, i.running, i.duration_ms
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
        return self._sweep(ts), request

    def dispatch(self, ts: float, request_id: str, worker: str) -> list[Violation]:
        found = self.checker.before_dispatch(self.mirror, ts, request_id, worker)
        self.mirror.apply_dispatch(ts, request_id, worker)
        return found + self._sweep(ts)

    def progress(self, ts: float, request_id: str, generated: int) -> list[Violation]:
        found = self.checker.before_progress(self.mirror, ts, request_id, generated)
        self.mirror.apply_progress(ts, request_id, generated)
        return found + self._sweep(ts)

    def finish(
        self, ts: float, request_id: str, output_tokens: int, reason: str
    ) -> tuple[list[Violation], Completed | None]:
        found = self.checker.before_finish(self.mirror, ts, request_id)
        done = self.mirror.apply_finish(ts, request_id, output_tokens, reason)
        return found + self._sweep(ts), done

    def engine_step(
        self, ts: float, worker: str, step: int, running: int, duration_ms: float
    ) -> tuple[list[Violation], StepView | None]:
        """Count the step; compare what the engine ran with what the mirror expected."""
        view = self.mirror.apply_engine_step(ts, worker, step, ts - duration_ms / 1000.0, running)
        found = []
        if view is not None:
            found = self.checker.on_engine_step(ts, worker, view.running, running)
        return found + self._sweep(ts), view

    def forget(self, before_ts: float) -> int:
        """Drop requests finished before `before_ts` (`FleetMirror.forget_finished`); the
        owner sends a `ForgetItem` down the stream too, so that a
        follower's replica forgets at the same point."""
        self.checker.forget(before_ts)
        return self.mirror.forget_finished(before_ts)

    def _sweep(self, ts: float) -> list[Violation]:
        if ts < self._next_sweep:
            return []
        self._next_sweep = ts + self.sweep_every_s
        return self.checker.sweep_ghosts(self.mirror)

    def apply(self, item: StreamItem) -> None:
        """Apply one stream item (the follower's path), by its kind."""
        self._by_kind[item.__class__](item)
