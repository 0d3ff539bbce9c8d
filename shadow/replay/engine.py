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
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shadow.policies.base import Policy
from shadow.policies.snapshot import NO_KEY, ActiveSet, FleetSnapshot, ReadyPool
from shadow.replay.workload import StepModel, Workload

#: Steps computed per block at most, so long idle-free stretches stay small in memory.
MAX_BLOCK_STEPS = 512


@dataclass(frozen=True)
class InitialRequest:
    """A request already decoding when the replay starts (a window's observed start state)."""

    worker: int
    prompt_tokens: int
    generated: int
    remaining: int
    prompt_key: int = int(NO_KEY)


@dataclass(frozen=True)
class ReplayResult:
    """Everything one policy's replay produced, as plain arrays.

    Requests are indexed as in the workload, followed by the initial requests. Steps are
    numbered from 0; a request admitted before step `k` decodes steps `k .. finish_step`.
    Step ends are kept as computed (not start + duration) so that the end of one step is
    bit-for-bit the start of the next and the time of the admissions made there.
    """

    policy: str
    workers: int
    batch: int
    step_model: StepModel
    step_start_ms: np.ndarray
    step_end_ms: np.ndarray
    step_duration_ms: np.ndarray
    worker_load: np.ndarray
    worker_active: np.ndarray
    ready_ms: np.ndarray
    admit_ms: np.ndarray
    admit_step: np.ndarray
    finish_step: np.ndarray
    worker: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    from_initial: np.ndarray
    sched_ms: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.step_start_ms.shape[0])


ProgressCallback = Callable[[int, int], None]


class _Fleet:
    """Mutable fleet state: the only place the replay mutates (the policy only reads)."""

    def __init__(self, workers: int, batch: int, total: int) -> None:
        self.workers = workers
        self.batch = batch
        self.base = np.zeros(workers, dtype=np.int64)  # sum over active of (s_i - admit_step_i)
        self.count = np.zeros(workers, dtype=np.int64)
        self.active = np.empty(0, dtype=np.int64)
        self.worker = np.full(total, -1, dtype=np.int64)
        self.admit_step = np.full(total, -1, dtype=np.int64)
        self.finish_step = np.full(total, -1, dtype=np.int64)
        self.admit_ms = np.full(total, np.nan)

    def admit(self, request: int, g: int, step: int, now_ms: float, prompt: int, output: int):
        self.worker[request] = g
        self.admit_step[request] = step
        self.finish_step[request] = step + output - 1
        self.admit_ms[request] = now_ms
        self.base[g] += prompt - step
        self.count[g] += 1

    def loads(self, step: int) -> np.ndarray:
        return self.base + self.count * step


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
) -> ReplayResult:
    """Replay `workload` on a fleet of `workers` x `batch` slots under `policy`.

    By default the policy runs its round before each step (BALANCEROUTE.md). With
    `decide_on_arrival` a request arriving during a step is decided at once, on that
    step's state, as a live router does; it still first decodes in the next step.
    """
    if workers < 1 or batch < 1:
        raise ValueError(f"workers and batch must be >= 1, got {workers} and {batch}")
    model = step_model or StepModel()
    n_trace = len(workload)
    prompt = np.concatenate(
        (workload.prompt_tokens, np.array([r.prompt_tokens for r in initial], dtype=np.int64))
    )
    output = np.concatenate(
        (
            workload.output_tokens,
            np.array([r.generated + r.remaining for r in initial], dtype=np.int64),
        )
    )
    keys = np.concatenate(
        (workload.prompt_keys, np.array([r.prompt_key for r in initial], dtype=np.int64))
    )
    trace_ready_ms = workload.ready_s * 1000.0
    ready_ms = np.concatenate((trace_ready_ms, np.full(len(initial), np.nan)))
    total = prompt.shape[0]
    fleet = _Fleet(workers, batch, total)
    for offset, request in enumerate(initial):
        if not 0 <= request.worker < workers:
            raise ValueError(f"initial request on worker {request.worker}: out of range")
        if request.remaining < 1 or request.generated < 0:
            raise ValueError("initial requests need remaining >= 1 and generated >= 0")
        fleet.admit(
            n_trace + offset,
            request.worker,
            -request.generated,
            np.nan,
            request.prompt_tokens,
            int(output[n_trace + offset]),
        )
    # An observed start state may hold more than B on a worker (the live fleet broke an
    # invariant, or the mirror still holds a slot the engine reused): it is replayed as
    # seen, and that worker takes nothing new until it has drained below B.
    fleet.active = np.arange(n_trace, total, dtype=np.int64)

    predictor = getattr(policy, "predictor", None)
    queued = policy.dispatches_on_arrival
    queues: list[deque[int]] = [deque() for _ in range(workers)]
    queue_tokens = np.zeros(workers, dtype=np.int64)
    capacity = np.full(workers, batch, dtype=np.int64)
    worker_ids = tuple(range(workers))
    pool = np.empty(0, dtype=np.int64)
    arrived = 0
    step = 0
    now = 0.0
    finished = 0
    starts: list[np.ndarray] = []
    step_ends: list[np.ndarray] = []
    durations: list[np.ndarray] = []
    loads_blocks: list[np.ndarray] = []
    active_rows: list[np.ndarray] = []
    block_lengths: list[int] = []
    sched: list[float] = []
    started: list[int] = []

    def admission_round(view_step: int, on_arrival_until: float | None) -> None:
        """One round on the state of step `view_step`; admitted requests start at `step`.

        With `on_arrival_until` (decide on arrival), the round runs during a step on that
        step's state, for the requests that arrived in it; each is recorded as assigned
        at its arrival time.
        """
        nonlocal pool
        free = np.maximum(batch - fleet.count, 0)
        if not pool.size or not (queued or free.sum() > 0):
            return
        active = fleet.active
        generated = view_step - fleet.admit_step[active]
        snapshot = FleetSnapshot(
            worker_ids,
            capacity,
            fleet.count.copy(),
            fleet.loads(view_step),
            ActiveSet(
                fleet.worker[active],
                prompt[active],
                generated,
                keys[active],
                output[active] - generated,
            ),
            np.array([len(q) for q in queues], dtype=np.int64),
            queue_tokens.copy(),
            now,
        )
        ready = ReadyPool(pool, prompt[pool], keys[pool])
        clock = time.perf_counter()
        admissions = policy.admit(snapshot, ready)
        sched.append((time.perf_counter() - clock) * 1000.0)
        if not admissions and on_arrival_until is None:
            raise RuntimeError(
                f"policy {policy.name} admitted nothing with {pool.size} ready requests "
                f"and {int(free.sum())} free slots (step {step})"
            )
        taken = []
        for request_id, g in admissions:
            request = int(request_id)
            taken.append(request)
            if queued:
                queues[g].append(request)
                queue_tokens[g] += prompt[request]
            else:
                decided = now if on_arrival_until is None else float(ready_ms[request])
                fleet.admit(request, g, step, decided, int(prompt[request]), int(output[request]))
                started.append(request)
        if taken:
            # The pool stays sorted (requests join in index order), so positions are a search.
            keep = np.ones(pool.size, dtype=bool)
            keep[np.searchsorted(pool, taken)] = False
            pool = pool[keep]

    while True:
        # Arrivals up to now join the pool.
        upto = int(np.searchsorted(trace_ready_ms, now, side="right"))
        if upto > arrived:
            pool = np.concatenate((pool, np.arange(arrived, upto, dtype=np.int64)))
            arrived = upto
        waiting_total = sum(len(q) for q in queues) if queued else 0
        if not fleet.active.size and not pool.size and not waiting_total:
            if arrived >= n_trace:
                break
            now = float(ready_ms[arrived])
            continue

        # Admission round.
        admission_round(step, None)
        if queued:
            for g in range(workers):
                while queues[g] and fleet.count[g] < batch:
                    request = queues[g].popleft()
                    queue_tokens[g] -= prompt[request]
                    fleet.admit(request, g, step, now, int(prompt[request]), int(output[request]))
                    started.append(request)
        if started:
            fleet.active = np.concatenate((fleet.active, np.array(started, dtype=np.int64)))
            started.clear()
        if not fleet.active.size:
            continue  # everything queued or nothing to run: jump to the next arrival

        # A stretch of steps with a fixed active set.
        first_finish = int(fleet.finish_step[fleet.active].min())
        length = min(first_finish - step + 1, MAX_BLOCK_STEPS)
        offsets = np.arange(step, step + length, dtype=np.int64)
        block = fleet.base[None, :] + fleet.count[None, :] * offsets[:, None]
        block_durations = model.a_ms_per_token * block.max(axis=1) + model.b_ms
        ends = now + np.cumsum(block_durations)
        cut_by_arrival = False
        if (queued or (fleet.count < batch).any()) and arrived < n_trace:
            # Stop at the first step boundary at or after the next arrival, so the next
            # admission round sees it (with worker queues every arrival is dispatched at
            # once, full fleet or not).
            cut = int(np.searchsorted(ends, ready_ms[arrived], side="left"))
            if cut < length:
                cut_by_arrival = True
                length = cut + 1
                block, block_durations, ends = (
                    block[:length],
                    block_durations[:length],
                    ends[:length],
                )
        starts.append(np.concatenate(([now], ends[:-1])))
        step_ends.append(ends)
        durations.append(block_durations)
        loads_blocks.append(block)
        active_rows.append(fleet.count.copy())
        block_lengths.append(length)
        now = float(ends[-1])
        step += length

        if decide_on_arrival and cut_by_arrival:
            # A live router decides when the request arrives, during this step, on this
            # step's state (its finishing requests still hold their slots); a queued
            # request still starts only at the next boundary.
            upto = int(np.searchsorted(trace_ready_ms, now, side="right"))
            if upto > arrived:
                pool = np.concatenate((pool, np.arange(arrived, upto, dtype=np.int64)))
                arrived = upto
            admission_round(step - 1, now)
            if started:
                fleet.active = np.concatenate((fleet.active, np.array(started, dtype=np.int64)))
                started.clear()

        # Completions at the end of the stretch free their slots; predictors learn from them.
        done_mask = fleet.finish_step[fleet.active] == step - 1
        if done_mask.any():
            done = fleet.active[done_mask]
            fleet.active = fleet.active[~done_mask]
            np.subtract.at(fleet.base, fleet.worker[done], prompt[done] - fleet.admit_step[done])
            np.subtract.at(fleet.count, fleet.worker[done], 1)
            finished += done.size
            if predictor is not None:
                predictor.observe_many(output[done], keys[done])
            if progress is not None:
                progress(finished, total)

    def stacked(blocks: list[np.ndarray], width: int, dtype: type) -> np.ndarray:
        if not blocks:
            return np.empty((0, width), dtype=dtype)
        return np.concatenate(blocks).astype(dtype, copy=False)

    return ReplayResult(
        policy=policy.name,
        workers=workers,
        batch=batch,
        step_model=model,
        step_start_ms=np.concatenate(starts) if starts else np.empty(0),
        step_end_ms=np.concatenate(step_ends) if step_ends else np.empty(0),
        step_duration_ms=np.concatenate(durations) if durations else np.empty(0),
        worker_load=stacked(loads_blocks, workers, np.int64),
        worker_active=(
            np.repeat(np.array(active_rows, dtype=np.int32), block_lengths, axis=0)
            if active_rows
            else np.empty((0, workers), dtype=np.int32)
        ),
        ready_ms=ready_ms,
        admit_ms=fleet.admit_ms,
        admit_step=fleet.admit_step,
        finish_step=fleet.finish_step,
        worker=fleet.worker,
        prompt_tokens=prompt,
        output_tokens=output,
        from_initial=np.arange(total) >= n_trace,
        sched_ms=np.array(sched),
    )
