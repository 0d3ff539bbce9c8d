"""The audit hand-off: the applied stream goes to the audit follower (in this process, or
in its worker process as msgpack), and its decisions come back to be stored.

The backlog of batches in the worker is bounded (`Limits.max_audit_backlog`): past it,
ingest waits for the oldest batch, so the audit's memory and lag stay bounded when it
falls behind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING

from shadow.service.ingest.apply import FleetState
from shadow.stream.audit import AuditFollower, AuditOutcome, Decision, run_in_worker
from shadow.stream.invariants import Violation
from shadow.stream.items import DispatchItem, StreamItem, encode_stream

if TYPE_CHECKING:
    from shadow.service.ingest.config import PipelineConfig


class AuditHandoff:
    """Hands batches of the stream to the follower and collects what it decided."""

    def __init__(
        self,
        config: PipelineConfig,
        executor: Executor | None,
        fleet: Callable[[str], FleetState],
        bound_hits: Counter[str],
    ) -> None:
        """Without `executor` the follower runs inline; `fleet` gives a fleet's state (its
        invariant checker words a shadow choice of a full worker)."""
        self.config = config
        self.executor = executor
        self._fleet = fleet
        self._bound_hits = bound_hits
        self._follower = (
            AuditFollower(config.audit, config.invariants, config.ghost_sweep_every_s)
            if executor is None
            else None
        )
        self._done: list[AuditOutcome] = []
        #: (first audited ingest id or inf, the worker's answer, the batch's last event
        #: time), oldest first
        self._pending: list[tuple[float, Future[list[AuditOutcome]], float]] = []
        #: event time of the last item handed over, and of the last one audited
        self._handed_ts = float("-inf")
        self._audited_ts = float("-inf")

    def submit(self, stream: list[StreamItem]) -> None:
        """Hand the applied stream to the audit follower (here, or in its process)."""
        if not stream:
            return
        last_ts = stream[-1].ts
        self._handed_ts = max(self._handed_ts, last_ts)
        if self._follower is not None:
            self._done.extend(self._follower.run(stream))
            self._audited_ts = self._handed_ts
            return
        assert self.executor is not None
        first = next(
            (
                item.audit.ingest_id
                for item in stream
                if item.__class__ is DispatchItem and item.audit is not None  # type: ignore[attr-defined]
            ),
            float("inf"),
        )
        pending = self._pending
        future = self.executor.submit(run_in_worker, encode_stream(stream))
        pending.append((first, future, last_ts))
        if len(pending) > self.config.limits.max_audit_backlog:
            # the worker fell behind: wait for its oldest batch rather than queue more
            self._bound_hits["audit_backlog"] += 1
            self._done.extend(self._take_oldest())

    def _take_oldest(self) -> list[AuditOutcome]:
        _, future, last_ts = self._pending.pop(0)
        outcomes = future.result()
        self._audited_ts = max(self._audited_ts, last_ts)
        return outcomes

    @property
    def lag_s(self) -> float:
        """How far the audit is behind the applied stream, in seconds of event time (the
        fleet's clock): 0 when every batch handed over is audited."""
        if not self._pending:
            return 0.0
        # nothing audited yet: at least the oldest batch in flight is behind
        done = max(self._audited_ts, self._pending[0][2])
        return max(0.0, self._handed_ts - done)

    @property
    def backlog(self) -> int:
        """Batches handed to the audit worker whose decisions are not collected yet."""
        return len(self._pending)

    def first_pending_id(self) -> int | None:
        """The first ingest id of the oldest batch still being audited (batches of
        learning only have none): the checkpoint stays before it."""
        for first, _, _ in self._pending:
            if first != float("inf"):
                return int(first)
        return None

    def collect(
        self, wait: bool = False
    ) -> tuple[list[tuple[int, Decision]], list[tuple[int, Violation]]]:
        """The decisions audited so far (all in flight with `wait`), and the violations
        of shadow choices of a worker with no room and of shadow rounds that raised or
        timed out."""
        outcomes, self._done = self._done, []
        while self._pending and (wait or self._pending[0][1].done()):
            outcomes.extend(self._take_oldest())
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
            if outcome.errors:
                checker = self._fleet(outcome.fleet).checker
                first = outcome.decisions[0] if outcome.decisions else None
                for policy, what in outcome.errors:
                    made = checker.shadow_error(
                        first.ts if first else 0.0, policy, first.request_id if first else "", what
                    )
                    violations.extend((outcome.ingest_id, v) for v in made)
        return decisions, violations
