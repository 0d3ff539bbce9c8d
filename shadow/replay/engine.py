"""Discrete-step decode-fleet simulator: the product's measuring instrument.

Semantics (BALANCEROUTE.md): before each step the policy runs an admission round; the
step takes `a * max_g L_g + b`; every active request generates one token; finished
requests free their slots at the end of the step; idle time jumps to the next arrival.

How work is held is the policy's to declare (`Policy.holds_work`):

- pool: a ready request waits in the central pool until the policy admits it into a
  free slot;
- worker queues: the policy dispatches each request when it arrives (the block is cut
  at every arrival so the decision sees the fleet at that moment); the request joins its
  worker's FCFS queue and starts when that worker has a free slot; it never moves.

Event-driven: between an admission round and the next completion (or the next arrival
that can change a decision) the active set is fixed and every load grows by its active
count per step, `L_g(k) = base_g + n_g * k`. The engine computes such a stretch of steps
in one vectorised block instead of step by step; per-step results are identical.

`FleetReplay` is the run itself, resumable: fed arrivals a window at a time (a continuous
counterfactual) it steps exactly as `replay()` fed them all at once; such a run drops the
requests its consumer has measured (`drop_finished`), so its memory follows the requests
in flight, not every request it was ever fed.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from shadow.policies.base import Policy
from shadow.policies.snapshot import NO_KEY, ActiveSet, FleetSnapshot, ReadyPool
from shadow.replay.fleet_state import GrownColumn, RunningFleet, Stretch
from shadow.replay.records import InitialRequest, ProgressCallback, ReplayResult, StepBlock
from shadow.replay.workload import StepModel, Workload

#: Steps computed per block at most, so long idle-free stretches stay small in memory.
MAX_BLOCK_STEPS = 512
#: the running requests' rows a round gets when its policy never reads them
#: (`Policy.reads_active`): none (zero-length columns, so shared safely)
_NO_ROWS = ActiveSet.empty()


class FleetReplay:
    """One policy's fleet, stepped as far as the known arrivals allow.

    `add_requests` appends arrivals in ready order with their true output lengths;
    `advance(until_ms)` steps the fleet while every arrival it could meet is known: the
    caller promises that every request ready at or before `until_ms` has been added. A
    continuous counterfactual adds each window's arrivals as their lengths become known
    and never resets; `replay()` adds a whole workload and advances to the end. Both give
    the same steps bit for bit: the run pauses only before an admission round at a
    boundary past the frontier, or before a stretch of steps that could meet an arrival
    not yet known, and resumes exactly there (the stretch is recomputed from the same
    state, now with the next arrival known).

    Requests are indexed in the order they were added: the initial requests (those
    already decoding at the start) first, then the arrivals; `drop_finished` removes
    finished ones and renumbers the rest, keeping that order (a policy sees the ids only
    to hand them back, and ties go by pool position, so the steps do not change).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        workers: int,
        batch: int,
        step_model: StepModel | None = None,
        initial: Sequence[InitialRequest] = (),
        decide_on_arrival: bool = False,
        progress: ProgressCallback | None = None,
        capacity: Sequence[int] | None = None,
        time_rounds: bool = True,
    ) -> None:
        if workers < 1 or batch < 1:
            raise ValueError(f"workers and batch must be >= 1, got {workers} and {batch}")
        slots = np.full(workers, batch, dtype=np.int64)
        if capacity is not None:
            slots = np.asarray(capacity, dtype=np.int64).ravel().copy()
            if slots.shape[0] != workers or (slots < 0).any():
                raise ValueError(f"capacity needs {workers} values >= 0, got {list(slots)}")
        self.policy = policy
        self.workers = workers
        self.batch = batch
        self.model = step_model or StepModel()
        self.decide_on_arrival = decide_on_arrival
        self.progress = progress
        self.predictor = getattr(policy, "predictor", None)
        self.queued = policy.dispatches_on_arrival
        #: the rounds of a policy that never reads the running requests' rows get none
        self._reads_active = getattr(policy, "reads_active", True)
        self.queues: list[deque[int]] = [deque() for _ in range(workers)]
        self.queue_tokens = np.zeros(workers, dtype=np.int64)
        self._no_queues = np.zeros(workers, dtype=np.int64)
        self._no_queues.setflags(write=False)  # shared by every round: a write would stick
        #: slots per worker (a window's fleet as observed: uneven B, 0 for a draining
        #: worker, which decodes what it holds and takes nothing new); a continuous run
        #: sets it as the fleet changes
        self.capacity = slots
        self.worker_ids = tuple(range(workers))
        self.fleet = RunningFleet(workers, batch)
        self.prompt = GrownColumn(np.int64)
        self.output = GrownColumn(np.int64)
        self.keys = GrownColumn(np.int64)
        self.ready_ms = GrownColumn(np.float64)
        self.initial_count = len(initial)
        #: requests dropped by `drop_finished` (finished and measured)
        self.dropped = 0
        #: the ready time of the last arrival added (-inf: none yet), kept apart from the
        #: per-request column so that dropping finished arrivals does not move the frontier
        self._last_ready_ms = -math.inf
        self.pool = np.empty(0, dtype=np.int64)
        self.arrived = 0  # requests (initial ones included) that have joined the pool
        self.step = 0
        self.now = 0.0
        self.finished = 0
        #: the stretch of steps in progress when the run waits at the frontier
        self._stretch: Stretch | None = None
        self._taken_step = 0
        self._blocks: list[tuple[np.ndarray, ...]] = []
        self._block_rows: list[tuple[np.ndarray, int]] = []
        #: each admission round's wall time (ms), with `time_rounds`: a replay reports
        #: them; a continuous run, which never ends, keeps none
        self.sched_ms: list[float] = []
        self.time_rounds = time_rounds
        self._started: list[int] = []
        self._add(
            np.array([r.prompt_tokens for r in initial], dtype=np.int64),
            np.array([r.generated + r.remaining for r in initial], dtype=np.int64),
            np.array([r.prompt_key for r in initial], dtype=np.int64),
            np.full(len(initial), np.nan),
        )
        for index, request in enumerate(initial):
            if not 0 <= request.worker < workers:
                raise ValueError(f"initial request on worker {request.worker}: out of range")
            if request.remaining < 1 or request.generated < 0:
                raise ValueError("initial requests need remaining >= 1 and generated >= 0")
            self.fleet.admit(
                index,
                request.worker,
                -request.generated,
                np.nan,
                request.prompt_tokens,
                int(self.output.view[index]),
            )
        # An observed start state may hold more than B on a worker (the live fleet broke an
        # invariant, or the mirror still holds a slot the engine reused): it is replayed as
        # seen, and that worker takes nothing new until it has drained below B.
        self.fleet.active = np.arange(len(initial), dtype=np.int64)
        self.arrived = len(initial)

    @property
    def requests(self) -> int:
        return self.prompt.size

    def _add(self, prompt, output, keys, ready_ms) -> None:
        self.prompt.extend(prompt)
        self.output.extend(output)
        self.keys.extend(keys)
        self.ready_ms.extend(ready_ms)
        self.fleet.reserve(self.prompt.size)

    def add_requests(
        self,
        ready_ms: np.ndarray,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        prompt_keys: np.ndarray | None = None,
    ) -> None:
        """Append arrivals, in ready order, at or after every one added before."""
        ready = np.asarray(ready_ms, dtype=np.float64)
        if ready.size:
            if ready[0] < self._last_ready_ms or (np.diff(ready) < 0).any():
                raise ValueError("arrivals must be added in ready order")
            self._last_ready_ms = float(ready[-1])
        keys = (
            np.full(ready.shape[0], NO_KEY, dtype=np.int64)
            if prompt_keys is None
            else np.asarray(prompt_keys, dtype=np.int64)
        )
        self._add(
            np.asarray(prompt_tokens, dtype=np.int64),
            np.asarray(output_tokens, dtype=np.int64),
            keys,
            ready,
        )

    def _admission_round(self, view_step: int, on_arrival_until: float | None) -> None:
        """One round on the state of step `view_step`; admitted requests start at `step`.

        With `on_arrival_until` (decide on arrival), the round runs during a step on that
        step's state, for the requests that arrived in it; each is recorded as assigned
        at its arrival time.
        """
        fleet, pool = self.fleet, self.pool
        free = np.maximum(self.capacity - fleet.count, 0)
        if not pool.size or not (self.queued or free.sum() > 0):
            return
        prompt, output, keys = self.prompt.view, self.output.view, self.keys.view
        if self._reads_active:
            active = fleet.active
            generated = view_step - fleet.admit_step[active]
            rows = ActiveSet(
                fleet.worker[active],
                prompt[active],
                generated,
                keys[active],
                output[active] - generated,
            )
        else:
            rows = _NO_ROWS
        if self.queued:
            waiting = np.array([len(q) for q in self.queues], dtype=np.int64)
            waiting_tokens = self.queue_tokens.copy()
        else:  # a pool policy's worker queues stay empty: the same zeros every round
            waiting = waiting_tokens = self._no_queues
        snapshot = FleetSnapshot(
            self.worker_ids,
            self.capacity,
            fleet.count.copy(),
            fleet.loads(view_step),
            rows,
            waiting,
            waiting_tokens,
            self.now,
        )
        ready = ReadyPool(pool, prompt[pool], keys[pool])
        clock = time.perf_counter()
        admissions = self.policy.admit(snapshot, ready)
        if self.time_rounds:
            self.sched_ms.append((time.perf_counter() - clock) * 1000.0)
        if not admissions and on_arrival_until is None:
            raise RuntimeError(
                f"policy {self.policy.name} admitted nothing with {pool.size} ready requests "
                f"and {int(free.sum())} free slots (step {self.step})"
            )
        taken = []
        for request_id, g in admissions:
            request = int(request_id)
            taken.append(request)
            if self.queued:
                if self.capacity[g] <= 0 and self.capacity.any():
                    # its queue would never start: fail loudly instead of stepping forever
                    raise RuntimeError(
                        f"policy {self.policy.name} queued request {request} at worker {g}, "
                        "which takes nothing (capacity 0)"
                    )
                self.queues[g].append(request)
                self.queue_tokens[g] += prompt[request]
            else:
                decided = (
                    self.now if on_arrival_until is None else float(self.ready_ms.view[request])
                )
                fleet.admit(
                    request, g, self.step, decided, int(prompt[request]), int(output[request])
                )
                self._started.append(request)
        if taken:
            if sorted(taken) == pool[: len(taken)].tolist():
                # the oldest requests (the baselines' every round, most of BR's): a slice
                self.pool = pool[len(taken) :]
            else:
                # The pool stays sorted (requests join in index order): positions are a search.
                keep = np.ones(pool.size, dtype=bool)
                keep[np.searchsorted(pool, taken)] = False
                self.pool = pool[keep]

    def _join_arrivals(self) -> None:
        ready = self.ready_ms.view
        upto = self.initial_count + int(
            np.searchsorted(ready[self.initial_count :], self.now, side="right")
        )
        if upto > self.arrived:
            self.pool = np.concatenate((self.pool, np.arange(self.arrived, upto, dtype=np.int64)))
            self.arrived = upto

    def _start_admitted(self) -> None:
        if self._started:
            self.fleet.active = np.concatenate(
                (self.fleet.active, np.array(self._started, dtype=np.int64))
            )
            self._started.clear()

    def advance(self, until_ms: float = math.inf) -> None:
        """Step the fleet as far as the arrivals known up to `until_ms` determine it."""
        # every arrival at or before this is known
        frontier = max(until_ms, self._last_ready_ms)
        if self._stretch is not None and not self._continue_stretch(frontier):
            return
        fleet, model = self.fleet, self.model
        total = self.requests
        ready_ms = self.ready_ms.view
        while True:
            if self.now > frontier:
                return  # arrivals up to now are not all known yet
            self._join_arrivals()
            waiting_total = sum(len(q) for q in self.queues) if self.queued else 0
            if not fleet.active.size and not self.pool.size and not waiting_total:
                if self.arrived >= total:
                    return  # idle, and no known arrival to jump to
                self.now = float(ready_ms[self.arrived])
                continue

            # Admission round.
            self._admission_round(self.step, None)
            if self.queued:
                prompt, output = self.prompt.view, self.output.view
                for g in range(self.workers):
                    while self.queues[g] and fleet.count[g] < self.capacity[g]:
                        request = self.queues[g].popleft()
                        self.queue_tokens[g] -= prompt[request]
                        fleet.admit(
                            request, g, self.step, self.now, int(prompt[request]),
                            int(output[request]),
                        )  # fmt: skip
                        self._started.append(request)
            self._start_admitted()
            if not fleet.active.size:
                continue  # everything queued or nothing to run: jump to the next arrival

            # A stretch of steps with a fixed active set.
            step, now = self.step, self.now
            first_finish = int(fleet.finish_step[fleet.active].min())
            length = min(first_finish - step + 1, MAX_BLOCK_STEPS)
            offsets = np.arange(step, step + length, dtype=np.int64)
            block = fleet.base[None, :] + fleet.count[None, :] * offsets[:, None]
            block_durations = model.a_ms_per_token * block.max(axis=1) + model.b_ms
            ends = now + np.cumsum(block_durations)
            starts = np.empty_like(ends)
            starts[0] = now
            starts[1:] = ends[:-1]
            self._stretch = Stretch(
                step, now, block, block_durations, ends, starts, fleet.count.copy(),
                # with worker queues every arrival is dispatched at once, full fleet or not
                self.queued or bool((fleet.count < self.capacity).any()),
            )  # fmt: skip
            if not self._continue_stretch(frontier):
                return

    def _continue_stretch(self, frontier: float) -> bool:
        """Commit the current stretch's steps up to its cut; False when it must wait.

        The stretch stops at the first step boundary at or after the next arrival (when a
        slot is free), so the next admission round sees it. With no arrival known past
        the frontier, the steps up to the frontier are committed and the rest waits: the
        stretch was computed whole from its start, so when it goes on, its cut and its
        step times are the very numbers the whole replay computes.
        """
        stretch = self._stretch
        assert stretch is not None
        total = self.requests
        length = stretch.ends.shape[0]
        cut_by_arrival = False
        waits = False
        if stretch.has_free:
            known = self.arrived < total
            horizon = self.ready_ms.view[self.arrived] if known else frontier
            cut = int(np.searchsorted(stretch.ends, horizon, side="left"))
            if cut < length:
                length = cut + 1
                cut_by_arrival = known
                waits = not known
        if waits or (cut_by_arrival and stretch.ends[length - 1] > frontier):
            # past the frontier: what follows the stretch (a decision during its last step
            # takes every arrival up to its end) waits until those arrivals are known
            waits = True
            length = max(
                stretch.committed, int(np.searchsorted(stretch.ends, frontier, side="left")) + 1
            )
            length = min(length, stretch.ends.shape[0])
        self._commit(stretch, length)
        if waits:
            return False
        self._stretch = None
        self._after_stretch(cut_by_arrival)
        return True

    def _commit(self, stretch: Stretch, length: int) -> None:
        if length <= stretch.committed:
            return
        lo = stretch.committed
        ends = stretch.ends
        starts = stretch.starts
        rows = stretch.block[lo:length]
        if length - lo < stretch.block.shape[0]:
            # a view would keep the whole stretch (up to MAX_BLOCK_STEPS x G loads) alive
            # until `take_steps`; while a fleet fills, arrivals cut nearly every stretch
            # after one step, and a G = 256 run held ~500 MiB of uncommitted rows that way
            rows = rows.copy()
        self._blocks.append(
            (starts[lo:length], ends[lo:length], stretch.durations[lo:length], rows)
        )  # fmt: skip
        self._block_rows.append((stretch.count, length - lo))
        stretch.committed = length
        self.now = float(ends[length - 1])
        self.step = stretch.step + length

    def _after_stretch(self, cut_by_arrival: bool) -> None:
        """The end of a stretch: a decision on arrival during its last step, then its
        completions."""
        fleet = self.fleet
        total = self.requests
        if self.decide_on_arrival and cut_by_arrival:
            # A live router decides when the request arrives, during this step, on this
            # step's state (its finishing requests still hold their slots); a queued
            # request still starts only at the next boundary.
            self._join_arrivals()
            self._admission_round(self.step - 1, self.now)
            self._start_admitted()

        # Completions at the end of the stretch free their slots; predictors learn.
        done_mask = fleet.finish_step[fleet.active] == self.step - 1
        if done_mask.any():
            prompt, output, keys = self.prompt.view, self.output.view, self.keys.view
            done = fleet.active[done_mask]
            fleet.active = fleet.active[~done_mask]
            if done.size == 1:  # one completion (most stretches): no ufunc.at
                request = int(done[0])
                g = int(fleet.worker[request])
                fleet.base[g] -= prompt[request] - fleet.admit_step[request]
                fleet.count[g] -= 1
            else:
                workers = fleet.worker[done]
                np.subtract.at(fleet.base, workers, prompt[done] - fleet.admit_step[done])
                np.subtract.at(fleet.count, workers, 1)
            self.finished += done.size
            if self.predictor is not None:
                self.predictor.observe_many(output[done], keys[done])
            if self.progress is not None:
                self.progress(self.finished, total + self.dropped)

    def take_steps(self) -> StepBlock:
        """The steps computed since the last call (a live consumer's increment; the run
        then keeps no per-step history)."""
        blocks, rows = self._blocks, self._block_rows
        self._blocks, self._block_rows = [], []
        first = self._taken_step
        self._taken_step = self.step
        return _step_block(first, self.workers, blocks, rows)

    def drop_finished(self, before_step: int) -> np.ndarray:
        """Forget the requests that finished before step `before_step` (their last step
        is before it and their completion has been taken), renumbering the rest in the
        order they were added. A continuous run calls it once a window's metrics are
        taken; the steps that follow are the same bit for bit (pool, active set and
        queues keep their order). Returns which of the requests held before the call
        were kept, so a caller's own per-request arrays can drop the same rows."""
        n = self.requests
        fleet = self.fleet
        assert not self._started, "drop_finished between admissions and their start"
        done = (fleet.worker[:n] >= 0) & (fleet.finish_step[:n] < before_step)
        done[fleet.active] = False  # its last step is taken, its completion not yet
        keep = ~done
        gone = int(done.sum())
        if not gone:
            return keep
        renumber = np.cumsum(keep) - 1
        self.pool = renumber[self.pool]
        fleet.active = renumber[fleet.active]
        self.queues = [deque(renumber[list(q)].tolist()) for q in self.queues]
        self.initial_count -= int(done[: self.initial_count].sum())
        self.arrived -= int(done[: self.arrived].sum())
        for column in (self.prompt, self.output, self.keys, self.ready_ms):
            column.compact(keep)
        fleet.compact(keep)
        self.dropped += gone
        return keep

    def requests_view(self) -> dict[str, np.ndarray]:
        """Per request held (in the order added; `drop_finished` removes the measured
        ones): ready, admit and finish times and worker."""
        n = self.requests
        fleet = self.fleet
        return {
            "ready_ms": self.ready_ms.view,
            "admit_ms": fleet.admit_ms[:n],
            "admit_step": fleet.admit_step[:n],
            "finish_step": fleet.finish_step[:n],
            "worker": fleet.worker[:n],
            "prompt_tokens": self.prompt.view,
            "output_tokens": self.output.view,
        }


def _step_block(
    first: int, workers: int, blocks: list[tuple[np.ndarray, ...]], rows: list
) -> StepBlock:
    if not blocks:
        empty = np.empty(0)
        return StepBlock(
            first, empty, empty, empty, np.empty((0, workers), dtype=np.int64),
            np.empty((0, workers), dtype=np.int32),
        )  # fmt: skip
    return StepBlock(
        first,
        np.concatenate([b[0] for b in blocks]),
        np.concatenate([b[1] for b in blocks]),
        np.concatenate([b[2] for b in blocks]),
        np.concatenate([b[3] for b in blocks]).astype(np.int64, copy=False),
        np.repeat(np.array([r[0] for r in rows], dtype=np.int32), [r[1] for r in rows], axis=0),
    )


def replay(
    workload: Workload,
    policy: Policy,
    *,
    workers: int,
    batch: int,
    step_model: StepModel | None = None,
    initial: Sequence[InitialRequest] = (),
    progress: ProgressCallback | None = None,
    decide_on_arrival: bool = False,
    capacity: Sequence[int] | None = None,
) -> ReplayResult:
    """Replay `workload` on a fleet of `workers` x `batch` slots under `policy`.

    By default the policy runs its round before each step (BALANCEROUTE.md). With
    `decide_on_arrival` a request arriving during a step is decided at once, on that
    step's state, as a live router does; it still first decodes in the next step.
    `capacity` gives each worker its own slots (a window's fleet as observed: uneven B,
    0 for a draining worker, which decodes what it holds and takes nothing new); without
    it every worker has `batch`.
    """
    if capacity is not None and not np.asarray(capacity).any() and len(workload):
        raise ValueError("capacity: no worker takes requests, so the arrivals never run")
    run = FleetReplay(
        policy,
        workers=workers,
        batch=batch,
        step_model=step_model,
        initial=initial,
        decide_on_arrival=decide_on_arrival,
        progress=progress,
        capacity=capacity,
    )
    run.add_requests(
        workload.ready_s * 1000.0,
        workload.prompt_tokens,
        workload.output_tokens,
        workload.prompt_keys,
    )
    run.advance(math.inf)
    steps = run.take_steps()
    # the result's order: the workload's requests, then the initial ones
    m = len(initial)
    order = np.concatenate((np.arange(m, run.requests), np.arange(m)))
    view = run.requests_view()
    return ReplayResult(
        policy=policy.name,
        workers=workers,
        batch=batch,
        step_model=run.model,
        step_start_ms=steps.start_ms,
        step_end_ms=steps.end_ms,
        step_duration_ms=steps.duration_ms,
        worker_load=steps.worker_load,
        worker_active=steps.worker_active,
        ready_ms=view["ready_ms"][order],
        admit_ms=view["admit_ms"][order],
        admit_step=view["admit_step"][order],
        finish_step=view["finish_step"][order],
        worker=view["worker"][order],
        prompt_tokens=view["prompt_tokens"][order],
        output_tokens=view["output_tokens"][order],
        from_initial=np.arange(run.requests) >= len(workload),
        sched_ms=np.array(run.sched_ms),
    )
