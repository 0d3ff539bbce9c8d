"""The apply step: one event, in stream order, into its fleet's state.

Per event: the window tracker sees it before the mirror does (windows cut at step
boundaries), the fleet core applies it and checks the invariants, the window tracker and
the step-model samples take what they need, and, with the audit on, the stream gets the
event's `StreamItem` for the audit follower. One table from event class to handler does
the dispatch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shadow.analysis.stepmodel import StepModelFit
from shadow.events import (
    DispatchEvent,
    EngineStepEvent,
    FinishEvent,
    ProgressEvent,
    ReadyEvent,
    WorkerEvent,
)
from shadow.service.ingest.step_samples import StepSamples
from shadow.service.store import UNJOIN, EventBatch
from shadow.stream.fleet import FleetCore
from shadow.stream.invariants import Violation
from shadow.stream.items import (
    AuditRequest,
    DispatchItem,
    EngineStepItem,
    FinishItem,
    ProgressItem,
    ReadyItem,
    StreamItem,
    WorkerItem,
)
from shadow.stream.join import CORRECTED, FINISHED, IGNORED
from shadow.stream.mirror import NATURAL_FINISH
from shadow.stream.sampling import AuditSampler
from shadow.stream.windows import WindowTracker

if TYPE_CHECKING:
    from shadow.service.ingest.config import PipelineConfig

STEP_SAMPLES_KEPT = 50_000  # the last ~6,000 steps of an 8-worker fleet


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
        self.step_samples = StepSamples(STEP_SAMPLES_KEPT)
        self.fit: StepModelFit | None = None
        #: engine steps where the mirror's load or active count differed from the engine's
        self.state_mismatches = 0
        self.engine_steps = 0
        self.late_events = 0
        #: the same by the late event's source and kind: which sender lags, and in what
        self.late_by_source: Counter[tuple[str, str]] = Counter()
        self.window_failures = 0
        self.incumbent = "jsq-pool"
        self.stored_windows: set[int] = set()
        #: engine scrapes waiting for the mirror to reach their time: (ts, worker, sample)
        self.pending_samples: list[tuple[float, str, Any]] = []
        #: per worker: (ts of the last scrape, engine running, mirror active then)
        self.last_sample: dict[str, tuple[float, float, int]] = {}
        #: which dispatches are audited (all, unless `audit_sampling` and the audit lags)
        self.sampler = AuditSampler()

    def held_requests(self) -> dict[str, int]:
        """Requests it holds state for, by holder (`shadow_held_requests`): `live` in the
        mirror, `finished` remembered for late events, `windows` held by the tracker."""
        requests = self.mirror.requests
        return {"live": len(requests.live), "finished": len(requests.finished),
                "windows": len(self.tracker.requests)}  # fmt: skip


Handler = Callable[[FleetState, Any, int, list[StreamItem], bool], "list[Violation] | None"]


class Applier:
    """Applies events to the fleets' states; `fleet` makes a fleet's state on first use."""

    def __init__(self, config: PipelineConfig, fleet: Callable[[str], FleetState]) -> None:
        self.windows = config.windows_enabled
        self.audit = config.audit_enabled
        self._fleet = fleet
        #: (ingest id, output_tokens, joined_to) of stored finish rows the join changed,
        #: for the pipeline to commit with what it derived (`EventBatch.update_finish`)
        self.finish_updates: list[tuple[int, int | None, int | None]] = []
        #: event class -> its handler: the one dispatch of the ingest path
        self._by_kind: dict[type, Handler] = {
            WorkerEvent: self._worker,
            ReadyEvent: self._ready,
            DispatchEvent: self._dispatch,
            ProgressEvent: self._progress,
            FinishEvent: self._finish,
            EngineStepEvent: self._engine_step,
        }

    def apply(
        self,
        event: Any,
        ingest_id: int,
        violations: list[tuple[int, Violation]],
        stream: list[StreamItem],
        *,
        derive: bool,
    ) -> None:
        """Apply one event; with `derive`, keep its violations and audit its dispatch
        (events before the checkpoint only rebuild state)."""
        state = self._fleet(event.fleet)
        if self.windows:
            state.tracker.before_event(event.type, event.ts)
        found = self._by_kind[event.__class__](state, event, ingest_id, stream, derive)
        if derive and found:
            violations.extend((ingest_id, v) for v in found)

    def take_finish_updates(self, batch: EventBatch) -> None:
        """Move the finish-row changes made so far into `batch`."""
        for ingest_id, tokens, joined in self.finish_updates:
            batch.update_finish(ingest_id, tokens, joined)
        self.finish_updates.clear()

    def _engine_step(
        self, state: FleetState, event: EngineStepEvent, _id: int, stream: list, _derive: bool
    ) -> list[Violation]:
        ts = event.ts
        waiting = event.waiting or 0
        found, view = state.core.engine_step(
            ts, event.worker, event.step, event.running, event.duration_ms, waiting
        )
        if view is not None:
            kv = event.kv_tokens if event.kv_tokens is not None else view.kv_tokens
            if view.running != event.running or kv != view.kv_tokens:
                state.state_mismatches += 1
            state.engine_steps += 1
            state.step_samples.append((event.step, kv, event.duration_ms, ts))
            if self.windows:
                state.tracker.on_engine_step(
                    ts, event.worker, event.step, event.duration_ms, event.running, kv
                )
        if self.audit:
            stream.append(
                EngineStepItem(
                    ts,
                    event.fleet,
                    event.worker,
                    event.step,
                    event.running,
                    event.duration_ms,
                    waiting,
                )
            )
        return found

    def _progress(
        self, state: FleetState, event: ProgressEvent, _id: int, stream: list, _derive: bool
    ) -> list[Violation]:
        found = state.core.progress(event.ts, event.request_id, event.generated)
        if self.windows:
            info = state.tracker.requests.get(event.request_id)
            if info is not None and event.generated > info.progress:
                info.progress = event.generated
        if self.audit:
            stream.append(ProgressItem(event.ts, event.fleet, event.request_id, event.generated))
        return found

    def _dispatch(
        self, state: FleetState, event: DispatchEvent, ingest_id: int, stream: list, derive: bool
    ) -> list[Violation]:
        ts = event.ts
        if self.audit:
            mirror = state.mirror
            request = mirror.requests.get(event.request_id)
            first = (request is None and not mirror.is_stale(ts, event.request_id)) or (
                request is not None and request.worker is None and not request.finished
            )
            audited = None
            if derive and first and event.worker in mirror.workers and state.sampler.keep():
                audited = AuditRequest(ingest_id, event.policy, event.router_view)
            stream.append(DispatchItem(ts, event.fleet, event.request_id, event.worker, audited))
        found = state.core.dispatch(ts, event.request_id, event.worker)
        if self.windows:
            state.tracker.on_dispatch(ts, event.request_id)
        if event.policy and event.policy != "unknown":
            state.incumbent = event.policy
        return found

    def _finish(
        self, state: FleetState, event: FinishEvent, ingest_id: int, stream: list, _derive: bool
    ) -> list[Violation]:
        """Through the join (`shadow.stream.join`): the stored rows follow what it did (a
        corrected count on the first finish's row, `joined_to` on a later one's)."""
        ts = event.ts
        found, outcome = state.core.finish_event(
            ts,
            event.request_id,
            event.output_tokens,
            event.reason,
            event.estimated,
            event.from_engine,
            ingest_id,
        )
        kind = outcome.kind
        done = outcome.completed
        if kind == FINISHED and outcome.early_ref >= 0:
            # a held engine finish met its request: its row joins this one, and its exact
            # count is this row's when it corrected the tap's estimate
            self.finish_updates.append((outcome.early_ref, None, ingest_id))
            if outcome.early_corrected and done is not None:
                self.finish_updates.append((ingest_id, done.output_tokens, None))
        if kind == FINISHED and self.windows and done is not None:
            # an estimate is no length to learn from: its correction is (below)
            exact = event.estimated is not True or outcome.early_corrected
            natural = event.reason in NATURAL_FINISH and exact
            state.tracker.on_finish(ts, outcome.request_id, done.output_tokens, natural)
        elif kind == CORRECTED and done is not None:
            if outcome.primary_ref >= 0:
                self.finish_updates.append((outcome.primary_ref, done.output_tokens, None))
            if self.windows:
                natural = done.reason in NATURAL_FINISH
                state.tracker.on_finish(done.ts, outcome.request_id, done.output_tokens, natural)
        if kind in (CORRECTED, IGNORED) and outcome.primary_ref >= 0:
            self.finish_updates.append((outcome.primary_ref, None, UNJOIN))
            self.finish_updates.append((ingest_id, None, outcome.primary_ref))
        if self.audit:
            stream.append(
                FinishItem(
                    ts,
                    event.fleet,
                    event.request_id,
                    event.output_tokens,
                    event.reason,
                    event.estimated,
                    event.from_engine,
                )
            )
        return found

    def _ready(
        self, state: FleetState, event: ReadyEvent, _id: int, stream: list, _derive: bool
    ) -> list[Violation]:
        ts = event.ts
        found, ready = state.core.ready(
            ts, event.request_id, event.prompt_tokens, event.prompt_hash
        )
        if ready is not None and self.windows:
            state.tracker.on_ready(ts, event.request_id)
        if self.audit:
            stream.append(
                ReadyItem(ts, event.fleet, event.request_id, event.prompt_tokens, event.prompt_hash)
            )
        return found

    def _worker(
        self, state: FleetState, event: WorkerEvent, _id: int, stream: list, _derive: bool
    ) -> list[Violation]:
        found = state.core.worker(event.ts, event.worker, event.capacity, event.state)
        if self.audit:
            stream.append(
                WorkerItem(event.ts, event.fleet, event.worker, event.capacity, event.state)
            )
        return found
