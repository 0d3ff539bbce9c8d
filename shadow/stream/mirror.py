"""The state mirror: what the fleet looks like, rebuilt from the event stream alone.

Per worker: capacity, state and the active requests; per request: prompt, where it runs
and how much it has generated; the ready pool in ready order; and a Survival predictor
fed by completed requests. The mirror and the replay engine are the only places that
mutate fleet state; the audit, the invariants and the windows read it.

Loads are maintained in O(1) per event. A request's generated count is the number of
engine steps its worker ran since the dispatch (`steps_g - offset_i`), raised by its
cumulative `progress` when that is ahead (a fleet without step telemetry, or a request
that started late). So `L_g = sum(s_i) + n_g * steps_g - sum(offset_i)`.

Finished requests are kept (a late duplicate of their events must not look new, and a
late exact count must still correct an estimate) until `forget_finished` drops them, as
rows of a `FinishedLedger` (`shadow.stream.finished_ledger`): only what those two need, in
columns, since a fleet finishing hundreds of requests a second holds ~`finished_ttl_s` x
that many of them.
After that the mirror only remembers the horizon, and an event for an unknown request
from before it is taken for a late duplicate of a forgotten request and ignored (see
`forget_finished`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from shadow.policies.snapshot import NO_KEY, ActiveSet, FleetSnapshot, prompt_key_id
from shadow.predict.predictors import SurvivalPredictor
from shadow.stream.finished_ledger import FinishedRequest, RequestTable
from shadow.stream.mirror_records import Completed, RequestState, StepView, WorkerState
from shadow.stream.ready_columns import ReadyColumns

#: Finish reasons after which a request's length says something about future requests.
NATURAL_FINISH = frozenset({"stop", "length"})
#: Clock slack when deciding whether a dispatch came before a step's start.
STEP_START_SLACK_S = 1e-6
#: Longer outputs are not learned: the Survival predictor keeps a histogram as long as
#: the longest output it saw, and one absurd count (a wrong event) must not cost gigabytes.
MAX_LEARNED_OUTPUT_TOKENS = 1 << 20


class _WorkerColumns:
    """Per-worker columns of the snapshot (join order), with the worker versions they
    were read at."""

    def __init__(self) -> None:
        self.ids: tuple[str, ...] = ()
        self.versions = np.zeros(0, dtype=np.int64)
        self.steps = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0, dtype=np.int64)
        self.load = np.zeros(0, dtype=np.int64)
        self.capacity = np.zeros(0, dtype=np.int64)

    def resize(self, workers: int, ids: tuple[str, ...]) -> None:
        """Room for `workers` (workers only join); new rows read at version -1: stale."""
        old = self.versions.shape[0]
        grow = workers - old
        self.ids = ids
        self.versions = np.concatenate((self.versions, np.full(grow, -1, dtype=np.int64)))
        for name in ("steps", "count", "load", "capacity"):
            column = getattr(self, name)
            setattr(self, name, np.concatenate((column, np.zeros(grow, dtype=np.int64))))


class FleetMirror:
    """The mirror of one fleet."""

    def __init__(self, fleet: str) -> None:
        self.fleet = fleet
        self.workers: dict[str, WorkerState] = {}
        self.order: list[WorkerState] = []
        #: live requests, and finished ones until `forget_finished`
        self.requests = RequestTable()
        self._live: dict[str, RequestState] = self.requests.live
        self.pool: OrderedDict[str, RequestState] = OrderedDict()
        #: the same pool as columns, made on first use (`ready`)
        self._ready: ReadyColumns | None = None
        self.predictor = SurvivalPredictor()
        self.now = 0.0
        # The active set as slot-indexed columns, so a snapshot is a mask and a gather.
        self._slot_used = np.zeros(256, dtype=bool)
        self._slot_worker = np.zeros(256, dtype=np.int64)
        self._slot_prompt = np.zeros(256, dtype=np.int64)
        self._slot_offset = np.zeros(256, dtype=np.int64)
        self._slot_key = np.zeros(256, dtype=np.int64)
        self._free_slots: list[int] = []
        self._slots_used = 0
        #: events of unknown requests from before this time are stale (`forget_finished`)
        self.forgotten_before = float("-inf")
        #: every worker's `version`, by join order (room for more than have joined)
        self._versions = np.zeros(64, dtype=np.int64)
        #: the per-worker columns of the last `snapshot`, and the versions they are of
        self._columns = _WorkerColumns()
        #: requests running on any worker (the sum of the workers' active counts)
        self.running = 0

    def _bump(self, worker: WorkerState) -> None:
        """Record a change of the worker (see `WorkerState.version`)."""
        worker.version += 1
        self._versions[worker.index] = worker.version

    def _take_slot(self, request: RequestState, worker: WorkerState) -> None:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self._slots_used
            self._slots_used += 1
            if slot >= self._slot_used.shape[0]:
                grow = self._slot_used.shape[0]
                self._slot_used = np.concatenate((self._slot_used, np.zeros(grow, dtype=bool)))
                for name in ("_slot_worker", "_slot_prompt", "_slot_offset", "_slot_key"):
                    column = getattr(self, name)
                    setattr(self, name, np.concatenate((column, np.zeros(grow, dtype=np.int64))))
        request.slot = slot
        self._slot_used[slot] = True
        self._slot_worker[slot] = worker.index
        self._slot_prompt[slot] = request.prompt_tokens
        self._slot_offset[slot] = request.offset
        self._slot_key[slot] = request.prompt_key

    # -- reads ---------------------------------------------------------------------

    def worker(self, worker_id: str) -> WorkerState | None:
        return self.workers.get(worker_id)

    def is_stale(self, ts: float, request_id: str) -> bool:
        """An event of a request the mirror does not know, from before the forget
        horizon: most likely a late duplicate of a forgotten request, so it is ignored."""
        return ts < self.forgotten_before and request_id not in self.requests

    def worker_versions(self) -> np.ndarray:
        """Every worker's `version`, in join order (a copy)."""
        return self._versions[: len(self.order)].copy()

    def loads(self) -> np.ndarray:
        return np.array([w.load for w in self.order], dtype=np.int64)

    def active_counts(self) -> np.ndarray:
        return np.array([len(w.active) for w in self.order], dtype=np.int64)

    def capacities(self) -> np.ndarray:
        """Slots per worker; a worker that is down or draining takes nothing new."""
        return np.array([w.capacity if w.accepting else 0 for w in self.order], dtype=np.int64)

    def snapshot(self, *, with_active: bool = True) -> FleetSnapshot:
        """The fleet as a routing policy sees it (worker ids in join order)."""
        columns = self._refreshed()
        if with_active and self.order:
            slots = np.flatnonzero(self._slot_used[: self._slots_used])
            worker = self._slot_worker[slots]
            generated = columns.steps[worker] - self._slot_offset[slots]
            active = ActiveSet(
                worker, self._slot_prompt[slots], generated, self._slot_key[slots], None
            )
        else:
            active = ActiveSet.empty()
        # copies: a snapshot is frozen, the columns move on with the mirror
        return FleetSnapshot(
            columns.ids,
            columns.capacity.copy(),
            columns.count.copy(),
            columns.load.copy(),
            active,
            np.zeros(len(self.order), dtype=np.int64),
        )

    def active_of(self, workers: np.ndarray) -> ActiveSet:
        """The active requests of `workers` (join-order indices) alone, their `worker`
        column the position in `workers`: what a snapshot's active set holds for them,
        read from their own requests instead of a scan of every slot (the audit's
        projection rebuilds one worker's row between two dispatches of a round)."""
        columns = self._refreshed()
        order = self.order
        lists = [[r.slot for r in order[g].active.values()] for g in workers.tolist()]
        sizes = np.fromiter(map(len, lists), np.int64, len(lists))
        slots = np.fromiter((slot for one in lists for slot in one), np.int64, int(sizes.sum()))
        steps = np.repeat(columns.steps[workers], sizes)
        return ActiveSet(
            np.repeat(np.arange(len(lists), dtype=np.int64), sizes),
            self._slot_prompt[slots],
            steps - self._slot_offset[slots],
            self._slot_key[slots],
            None,
        )

    def _refreshed(self) -> _WorkerColumns:
        """The per-worker columns, brought up to date for the workers whose version moved
        since the last call: a snapshot of a wide fleet (G = 256) reads a few workers,
        not all of them."""
        columns = self._columns
        order = self.order
        workers = len(order)
        if columns.versions.shape[0] != workers:
            columns.resize(workers, tuple(w.worker_id for w in order))
        versions = self._versions[:workers]
        for g in np.flatnonzero(versions != columns.versions).tolist():
            w = order[g]
            columns.steps[g] = w.steps
            columns.count[g] = len(w.active)
            columns.load[g] = w.load
            columns.capacity[g] = max(w.capacity, 0) if w.accepting else 0
        columns.versions[:] = versions
        return columns

    # -- writes (one per event type) ------------------------------------------------

    def _tick(self, ts: float) -> None:
        self.now = max(self.now, ts)

    def apply_worker(self, ts: float, worker_id: str, capacity: int, state: str) -> WorkerState:
        self._tick(ts)
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = WorkerState(len(self.order), worker_id, capacity, state)
            self.workers[worker_id] = worker
            self.order.append(worker)
            if worker.index >= self._versions.shape[0]:
                self._versions = np.concatenate((self._versions, np.zeros_like(self._versions)))
        else:
            worker.capacity = capacity
            worker.state = state
        self._bump(worker)
        return worker

    @property
    def ready(self) -> ReadyColumns:
        """The pool as columns (`ReadyColumns`), made from it on first use and kept in step
        from then on: only the audit's replica reads them, so the ingest path's mirror
        never pays for them."""
        if self._ready is None:
            self._ready = ReadyColumns()
            for request in self.pool.values():
                self._ready.add(request)
        return self._ready

    def apply_ready(
        self, ts: float, request_id: str, prompt_tokens: int, prompt_hash: str | None
    ) -> RequestState | None:
        """Add to the pool; None when the request is already known (a duplicate) or the
        event is stale."""
        self._tick(ts)
        if request_id in self.requests or ts < self.forgotten_before:
            return None
        key = prompt_key_id(prompt_hash) if prompt_hash is not None else int(NO_KEY)
        request = RequestState(request_id, prompt_tokens, key, ts)
        self.requests[request_id] = request
        self.pool[request_id] = request
        if self._ready is not None:
            self._ready.add(request)
        return request

    def apply_dispatch(self, ts: float, request_id: str, worker_id: str) -> RequestState | None:
        """Start the request on the worker. Unknown requests and workers are created (the
        invariants record why that is wrong); a second dispatch moves nothing; a stale one
        (`is_stale`) does nothing and returns None."""
        self._tick(ts)
        if self.is_stale(ts, request_id):
            return None
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = self.apply_worker(ts, worker_id, 0, "up")
        request = self.requests.get(request_id)
        if request is None:
            request = RequestState(request_id, 0, int(NO_KEY), ts)
            self.requests[request_id] = request
        if request.worker is not None or request.finished:
            return request
        self.pool.pop(request_id, None)
        if self._ready is not None:
            self._ready.remove(request)
        request.worker = worker
        request.dispatch_ts = ts
        request.last_seen_ts = ts
        request.offset = worker.steps - request.progress
        worker.active[request_id] = request
        worker.active_history.record(ts, len(worker.active) - 1, len(worker.active))
        self.running += 1
        worker.prompt_sum += request.prompt_tokens
        worker.offset_sum += request.offset
        worker.starting.append(request)
        self._bump(worker)
        self._take_slot(request, worker)
        return request

    def apply_progress(self, ts: float, request_id: str, generated: int) -> None:
        self._tick(ts)
        request = self._live.get(request_id)
        if request is None or request.finished:
            return
        request.last_seen_ts = ts
        if generated <= request.progress:
            return
        request.progress = generated
        worker = request.worker
        if worker is not None:
            lag = generated - (worker.steps - request.offset)
            if lag > 0:  # the engine says it is further along than the steps we saw
                request.offset -= lag
                worker.offset_sum -= lag
                self._bump(worker)
                self._slot_offset[request.slot] = request.offset

    def apply_finish(
        self,
        ts: float,
        request_id: str,
        output_tokens: int,
        reason: str,
        *,
        estimated: bool = False,
        ref: int = -1,
    ) -> Completed | None:
        """Release the slot and learn; None when the request was not running here.

        An `estimated` count (the tap's, a lower bound) is not learned: the predictor
        learns the exact count when it comes (`correct`)."""
        self._tick(ts)
        request = self._live.get(request_id)
        if request is None or request.finished:
            return None
        self.pool.pop(request_id, None)
        if self._ready is not None:
            self._ready.remove(request)
        worker = request.worker
        if worker is not None:
            self._release(worker, request, ts)
        request.finished = True
        request.output_tokens = output_tokens
        request.estimated = estimated
        request.finish_ts = ts
        request.reason = reason
        request.finish_ref = ref
        self._remember_finished(request, ts)
        if not estimated:
            self._learn(output_tokens, reason)
        return self._completed(request, worker.worker_id if worker is not None else None)

    def _remember_finished(self, request: RequestState, left_ts: float) -> None:
        """Hold the request as a `FinishedRequest` until `forget_finished`."""
        if self._live.get(request.request_id) is request:
            del self._live[request.request_id]
        self.requests.finished.add(
            request.request_id,
            left_ts,
            prompt_tokens=request.prompt_tokens,
            prompt_key=request.prompt_key,
            output_tokens=request.output_tokens,
            estimated=request.estimated,
            finish_ts=request.finish_ts,
            reason=request.reason,
            finish_ref=request.finish_ref,
        )

    def _learn(self, output_tokens: int, reason: str) -> None:
        if reason in NATURAL_FINISH and 1 <= output_tokens <= MAX_LEARNED_OUTPUT_TOKENS:
            self.predictor.observe(output_tokens)

    def _completed(self, request: RequestState | FinishedRequest, worker: str | None) -> Completed:
        return Completed(
            request.request_id,
            worker,
            request.prompt_tokens,
            request.output_tokens or 0,
            request.reason or "",
            request.finish_ts if request.finish_ts is not None else self.now,
        )

    def correct(self, request: RequestState | FinishedRequest, output_tokens: int) -> Completed:
        """An exact count for a request finished with an estimate: the completed record
        takes it, and the predictor learns it (it skipped the estimate)."""
        request.output_tokens = output_tokens
        request.estimated = False
        self._learn(output_tokens, request.reason or "")
        return self._completed(request, None)

    def apply_recompute(self, ts: float, request_id: str) -> RequestState | None:
        """The engine gave the request back (vllm-ascend's recompute scheduler): its slot
        is released and it returns to the pool, its progress kept, to be dispatched again
        (a dispatch that is then no double dispatch). None when it was not running."""
        self._tick(ts)
        request = self._live.get(request_id)
        if request is None or request.finished or request.worker is None:
            return None
        worker = request.worker
        self._release(worker, request, ts)
        # a request not yet seen in a step waits in `starting`: it must not be counted
        # twice there if it comes back to the same worker
        worker.starting = [r for r in worker.starting if r is not request]
        request.last_seen_ts = ts
        request.dispatch_ts = None
        self.pool[request_id] = request
        if self._ready is not None:
            self._ready.add(request)
        return request

    def _release(self, worker: WorkerState, request: RequestState, ts: float) -> None:
        request.progress = max(request.progress, worker.steps - request.offset)
        del worker.active[request.request_id]
        worker.active_history.record(ts, len(worker.active) + 1, len(worker.active))
        self.running -= 1
        worker.prompt_sum -= request.prompt_tokens
        worker.offset_sum -= request.offset
        self._bump(worker)
        self._slot_used[request.slot] = False
        self._free_slots.append(request.slot)
        request.slot = -1
        request.worker = None

    def release_ghost(self, request: RequestState) -> None:
        """Free the slot of a request that stopped reporting (it stays unfinished)."""
        if request.worker is not None:
            self._release(request.worker, request, self.now)
        request.finished = True
        self._remember_finished(request, self.now)

    def apply_engine_step(
        self,
        ts: float,
        worker_id: str,
        step: int,
        step_start: float | None = None,
        running: int | None = None,
    ) -> StepView | None:
        """Count one decode step of the worker; None for a step already counted.

        A dispatched request first decodes in a later step (it reaches the engine after
        the tap saw it, and engines admit between steps). Which of the pending ones ran
        in this step: as many as the engine's `running` count says, oldest first (engines
        admit in order); without a count, those dispatched before `step_start`. The
        others do not advance, and the returned view (what the engine should have
        reported) leaves them out.
        """
        self._tick(ts)
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = self.apply_worker(ts, worker_id, 0, "up")
        if step <= worker.last_step:
            return None
        if not worker.starting:  # nearly every step: no request waits to start
            view = StepView(len(worker.active), worker.load)  # before the count moves
            worker.last_step = step
            worker.steps += 1
            self._bump(worker)
            return view
        pending = [r for r in worker.starting if r.worker is worker]
        if running is not None:
            started = max(0, min(len(pending), running - (len(worker.active) - len(pending))))
        else:
            cutoff = (ts if step_start is None else step_start) + STEP_START_SLACK_S
            started = sum(1 for r in pending if r.dispatch_ts is None or r.dispatch_ts <= cutoff)
        waiting = pending[started:]
        late_tokens = 0
        for request in waiting:  # not in this step: hold its generated count still
            late_tokens += request.prompt_tokens + request.generated()
            request.offset += 1
            worker.offset_sum += 1
            self._slot_offset[request.slot] = request.offset
        view = StepView(len(worker.active) - len(waiting), worker.load - late_tokens + len(waiting))
        worker.starting = waiting
        worker.last_step = step
        worker.steps += 1
        self._bump(worker)
        return view

    def forget_finished(self, before_ts: float) -> int:
        """Drop the requests that finished (or were released as ghosts) before `before_ts`;
        returns how many. Memory then holds the live requests plus those finished since.

        What the mirror cannot tell any more is whether an event of an unknown request
        belongs to a forgotten one. Every event of a forgotten request has a time before
        its finish, hence before the horizon, so events of unknown requests from before
        `before_ts` are treated as late duplicates and ignored (no state change, no
        violation). The cost: a straggler of a new request that arrives with a time
        before the horizon is ignored too, and a re-dispatch of a forgotten request after
        the horizon counts as `dispatch_without_ready` instead of `double_dispatch`. So
        `before_ts` should lag `now` by far more than the reorder window and any retry.
        """
        if before_ts > self.forgotten_before:
            self.forgotten_before = before_ts
        forgotten = self.requests.finished.forget(before_ts)
        for worker in self.order:
            if len(worker.starting) > len(worker.active):
                # released requests wait here for the worker's next step; a worker
                # without step telemetry never steps, so they are dropped here
                worker.starting = [r for r in worker.starting if r.worker is worker]
        return forgotten
