"""Continuous counterfactuals: each evaluated policy drives its own simulated copy of the
fleet, fed every window's observed arrivals, and is never reset to the incumbent's state.

A per-window replay starts each window from the incumbent's state and holds only that
window's arrivals, so most of what it measures was placed by the incumbent (a long
request lives for minutes), and below saturation it measures step speed rather than
sustained throughput: measured on recorded traffic, its interval missed the end-to-end
truth. Here every policy's fleet starts once, from the first window's observed state
(active requests with their true remaining lengths), and from then on sees only what the
real fleet saw: arrivals at their observed times with their true output lengths (or, past
the maximum lag, lengths imputed by the Survival predictor and flagged), capacity changes
and workers going down. The incumbent is replayed the same way: the candidate is compared
with the replayed incumbent (same simulator, same arrivals), and the replayed incumbent
with the observed fleet is the fidelity check.

Windows are consecutive pieces of these runs: window k's metrics are measured on each
run's steps that start inside it, with the same definitions as the observed fleet's
(`window_metrics`). Because the runs carry over, neighbouring windows are correlated:
the gate's interval resamples blocks of consecutive windows and drops a warm-up after
each start (GATE.md). A run starts again (and says so: `run_start`) only when it cannot
go on: the first window, a window missing in between (a restart of the service, a window
that failed), a fleet whose worker set changed, the window after the evidence's last (the
runs drained there), or a step model that moved.

One step model per run: a replay is a function of its step model, and a run stepped
under a sequence of refits estimates no single replay (on a small fleet, where an arrival
lands in a step decides where it goes, fits 0.15% apart move the imbalance ratio by more
than the bias test's tolerance). So the runs keep the model they started with (the first
fit: a run started on the configured default moves to the first fit by starting again)
and start again, as on a capacity change, only when a refit would have predicted a step
they took more than `step_model_restart` (relative) differently. The windows they evaluate
carry that model (`WindowResult.step_model`, the windows' stored a and b); every refit is
stored on its own (`step_model_fits`).

Exactness: `FleetReplay` waits at the frontier of the known arrivals and goes on exactly
there, so a run fed window by window steps bit for bit as the whole replay of the same
arrivals (tests/test_continuous_replay.py); over recorded traffic the windows' sums are
the full replay's totals, which is what the bias test checks. Once a window is measured,
each run drops the requests that finished in its steps or before (`FleetReplay.
drop_finished`): a run lives as long as the service, and what it holds must follow the
requests in flight, not every request the fleet ever served (the same windows either way:
tests/test_continuous_estimates.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from shadow.policies import Policy, make_aa_policy, make_policy
from shadow.replay import InitialRequest
from shadow.replay.engine import FleetReplay
from shadow.replay.workload import StepModel
from shadow.stream.aa import jitter_step_s, moved_to, worker_order
from shadow.stream.guard import GuardedPolicy
from shadow.stream.trajectory import Trajectory, bucket
from shadow.stream.window_metrics import span_metrics, tpot_inside
from shadow.stream.windows import AA, OBSERVED, WindowResult, WindowSpec, fidelity, taught

#: the A/A run's arrival jitter seed (fixed: the same evidence, the same floor)
AA_SEED = 7919


@dataclass
class _Steps:
    """Steps computed but not yet assigned to a window (they start after its end)."""

    first_step: int = 0
    start_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    end_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    duration_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    load: np.ndarray | None = None
    active: np.ndarray | None = None

    def extend(self, block) -> None:
        if self.load is None:
            self.first_step = block.first_step
            self.load, self.active = block.worker_load, block.worker_active
            self.start_ms, self.end_ms = block.start_ms, block.end_ms
            self.duration_ms = block.duration_ms
            return
        assert self.active is not None
        self.start_ms = np.concatenate((self.start_ms, block.start_ms))
        self.end_ms = np.concatenate((self.end_ms, block.end_ms))
        self.duration_ms = np.concatenate((self.duration_ms, block.duration_ms))
        self.load = np.concatenate((self.load, block.worker_load))
        self.active = np.concatenate((self.active, block.worker_active))

    def split(self, before_ms: float) -> _Steps:
        """The steps that start before `before_ms`, removed from this buffer."""
        cut = int(np.searchsorted(self.start_ms, before_ms, side="left"))
        assert self.load is not None and self.active is not None
        head = _Steps(
            self.first_step, self.start_ms[:cut], self.end_ms[:cut], self.duration_ms[:cut],
            self.load[:cut], self.active[:cut],
        )  # fmt: skip
        self.first_step += cut
        self.start_ms, self.end_ms = self.start_ms[cut:], self.end_ms[cut:]
        self.duration_ms = self.duration_ms[cut:]
        self.load, self.active = self.load[cut:], self.active[cut:]
        return head


@dataclass
class _Run:
    name: str
    guarded: GuardedPolicy
    fleet: FleetReplay
    #: worker order of this run's fleet (the A/A run's relabelling; else identity)
    order: np.ndarray
    jitter: np.random.Generator | None = None
    steps: _Steps = field(default_factory=_Steps)
    errors_seen: int = 0
    last_ready_ms: float = 0.0
    #: the run's busy clock (ms from the origin): the window end while it has work, else
    #: the end of its last step; a window's busy time is how far it moved (`_busy_ms`)
    clock_ms: float = 0.0
    #: the end of the last step measured so far
    last_end_ms: float = 0.0
    #: per request held by the run's fleet (in its order), the end of its first step
    #: (NaN: not yet run)
    first_end_ms: np.ndarray = field(default_factory=lambda: np.empty(0))

    def drop_measured(self) -> None:
        """Forget the requests that finished in the steps measured so far: every window
        that needs them has taken its metrics (the steps still buffered are after them)."""
        keep = self.fleet.drop_finished(self.steps.first_step)
        self.first_end_ms = self.first_end_ms[: keep.shape[0]][keep]


class ContinuousCounterfactuals:
    """One fleet's continuous runs, evaluated window by window (`evaluate`, in order).

    `keep_finished` keeps every request the runs were fed (only to show that dropping the
    measured ones changes no window)."""

    def __init__(self, fleet: str, *, keep_finished: bool = False) -> None:
        self.fleet = fleet
        self.keep_finished = keep_finished
        self.runs: list[_Run] = []
        self.origin: float | None = None
        self.last_index: int | None = None
        self.workers = 0
        self.run_start: int | None = None
        #: the requests decoding in the start state (0: started from an empty fleet)
        self.run_start_held = 0
        #: how many times the runs had to start again
        self.starts = 0
        #: the step model the runs step under (fixed from their start), and whether it is
        #: a fit of the fleet's steps rather than the configured default
        self.model: StepModel | None = None
        self.model_fitted = False
        #: the largest worker load (KV tokens) any run has stepped: a refit is judged on
        #: the steps the runs took, 0 to this load
        self.max_load = 0.0
        #: how many of the starts a moved step model caused
        self.step_model_starts = 0
        #: the last window evaluated was the evidence's last: the runs drained in it
        self.drained = False

    def evaluate(self, spec: WindowSpec) -> WindowResult:
        """Window `spec.index`'s metrics from the runs, after feeding them its arrivals."""
        fresh = (
            not self.runs
            or self.last_index is None
            or spec.index != self.last_index + 1
            or spec.workers != self.workers
            or self.drained
        )
        if not fresh and self._step_model_moved(spec):
            fresh = True
            self.step_model_starts += 1
        if fresh:
            self._start(spec)
        assert self.origin is not None and self.model is not None
        model = self.model
        self.drained = spec.final
        self.last_index = spec.index
        w0 = (spec.t_start - self.origin) * 1000.0
        w1 = (spec.t_end - self.origin) * 1000.0
        # a pool at a continued window's start arrived in earlier windows, already fed
        first = 0 if fresh else spec.pool
        arrivals = spec.arrivals
        ready = w0 + arrivals.ready_s[first:] * 1000.0
        capacity = np.asarray(
            spec.capacity if spec.capacity is not None else (spec.batch,) * spec.workers,
            dtype=np.int64,
        )
        metrics: dict[str, dict[str, float]] = {OBSERVED: spec.observed}
        trajectories: dict[str, Trajectory] = {}
        if spec.observed_trajectory is not None:
            trajectories[OBSERVED] = spec.observed_trajectory
        errors: dict[str, tuple[int, str]] = {}
        tpot: dict[str, np.ndarray] = {}
        for run in self.runs:
            run.fleet.model = model
            slots = np.empty_like(capacity)
            slots[run.order] = capacity
            run.fleet.capacity[:] = slots
            times = ready
            if run.jitter is not None:  # A/A: up to one step later (stream/aa.py)
                step_ms = 1000.0 * jitter_step_s(spec.observed, model.b_ms)
                times = ready + run.jitter.uniform(0.0, step_ms, ready.shape[0])
            # kept in ready order across windows (a jittered arrival may pass the next one)
            times = np.maximum.accumulate(np.maximum(times, run.last_ready_ms))
            if times.size:
                run.last_ready_ms = float(times[-1])
            run.fleet.add_requests(
                times,
                arrivals.prompt_tokens[first:],
                arrivals.output_tokens[first:],
                arrivals.prompt_keys[first:],
            )
            # the evidence's last window: no arrival follows, every run drains (a full
            # replay's makespan and its last requests are part of what it measures)
            until = math.inf if spec.final else w1
            run.fleet.advance(until)
            run.steps.extend(run.fleet.take_steps())
            inside = run.steps.split(until)
            if inside.load is not None and inside.load.size:
                self.max_load = max(self.max_load, float(inside.load.max()))
            metrics[run.name], tpot[run.name] = self._measure(run, inside, w0, w1)
            if run.name != AA:
                assert inside.load is not None
                shown = inside.start_ms < w1  # the trajectory spans the window itself
                trajectories[run.name] = bucket(
                    inside.start_ms[shown] - w0, inside.duration_ms[shown],
                    inside.load[shown][:, run.order], w1 - w0,
                )  # fmt: skip
            if run.guarded.errors > run.errors_seen:
                errors[run.name] = (run.guarded.errors - run.errors_seen, run.guarded.error)
                run.errors_seen = run.guarded.errors
            if not self.keep_finished:
                run.drop_measured()
        fidelity_imbalance, fidelity_step = fidelity(metrics, spec)
        return WindowResult(
            spec.fleet,
            spec.index,
            spec.t_start,
            spec.t_end,
            len(arrivals) - first + (len(spec.initial) if fresh else 0),
            spec.imputed,
            model,
            metrics,
            fidelity_imbalance,
            fidelity_step,
            trajectories,
            errors,
            run_start=self.run_start,
            run_start_held=self.run_start_held,
            tpot_ms=tpot,
        )

    def _step_model_moved(self, spec: WindowSpec) -> bool:
        """Whether this window's step model replaces the runs': the first fit replaces the
        configured default; a later fit, when it predicts a step the runs took (max load
        0 to `max_load`; both models are linear in it, so the ends bound the change) more
        than `step_model_restart` differently. A default never replaces a fit."""
        if self.model is None or not spec.step_model_fitted:
            return False
        if not self.model_fitted:
            return True
        old, new = self.model, spec.step_model
        loads = [load for load in (0.0, self.max_load) if old.step_ms(load) > 0]
        change = max(
            (abs(new.step_ms(load) - old.step_ms(load)) / old.step_ms(load) for load in loads),
            default=0.0,
        )
        return change > spec.step_model_restart

    def _start(self, spec: WindowSpec) -> None:
        """New runs from this window's observed start state, under its step model."""
        self.model = spec.step_model
        self.model_fitted = spec.step_model_fitted
        self.origin = spec.t_start
        self.workers = spec.workers
        self.run_start = spec.index
        self.run_start_held = len(spec.initial)
        self.starts += 1
        self.runs = []
        identity = np.arange(spec.workers)
        for name in spec.policies:
            policy = make_policy(name, config=spec.balance_route)
            self.runs.append(self._run(name, policy, spec, spec.initial, identity))
        if spec.incumbent in spec.policies:
            seed = AA_SEED + spec.index
            order = worker_order(spec.workers, seed)
            moved = moved_to(spec.initial, order)
            aa = self._run(AA, make_aa_policy(spec.incumbent, seed=seed), spec, moved, order)
            aa.jitter = np.random.default_rng(seed)
            self.runs.append(aa)

    def _run(
        self,
        name: str,
        policy: Policy,
        spec: WindowSpec,
        initial: tuple[InitialRequest, ...],
        order: np.ndarray,
    ) -> _Run:
        guarded = GuardedPolicy(taught(policy, spec))
        fleet = FleetReplay(
            guarded,
            workers=spec.workers,
            batch=spec.batch,
            step_model=spec.step_model,
            initial=initial,
            decide_on_arrival=spec.decide_on_arrival,
            time_rounds=False,
        )
        return _Run(name, guarded, fleet, order)

    @staticmethod
    def _measure(
        run: _Run, steps: _Steps, w0: float, w1: float
    ) -> tuple[dict[str, float], np.ndarray]:
        """The window metrics of a run's steps inside the window (window_metrics'
        definitions: TPOT P95 of each request that decoded there, pool wait of each
        request dispatched there), with its busy time, the throughput over it, and the
        whole-life TPOT of each request that finished there (what the gate pools)."""
        assert steps.load is not None and steps.active is not None
        view = run.fleet.requests_view()
        n = steps.start_ms.shape[0]
        g0, g1 = steps.first_step, steps.first_step + n - 1
        admitted = view["worker"] >= 0
        overlap = admitted & (view["finish_step"] >= g0) & (view["admit_step"] <= g1)
        first = np.maximum(view["admit_step"][overlap] - g0, 0)
        last = np.minimum(view["finish_step"][overlap] - g0, n - 1)
        tpot = tpot_inside(steps.end_ms, first, last) if n else np.empty(0)
        admit_ms = view["admit_ms"]
        with np.errstate(invalid="ignore"):
            inside = (admit_ms >= w0) & (admit_ms < w1) & np.isfinite(view["ready_ms"])
        wait = admit_ms[inside] - view["ready_ms"][inside]
        metrics = span_metrics(
            steps.start_ms, steps.duration_ms, steps.load, steps.active.sum(axis=1),
            (w1 - w0) / 1000.0, tpot, wait,
        )  # fmt: skip
        lifetimes = _lifetime_tpot(run, view, steps, g0, g1)
        if n:
            run.last_end_ms = max(run.last_end_ms, float(steps.end_ms[-1]))
        busy_ms = _busy_ms(run, w1)
        tokens = float(steps.active.sum())
        metrics["busy_s"] = busy_ms / 1000.0
        metrics["throughput_tok_s"] = tokens / (busy_ms / 1000.0) if busy_ms > 0 else math.nan
        return metrics, lifetimes


def _lifetime_tpot(
    run: _Run, view: dict[str, np.ndarray], steps: _Steps, g0: int, g1: int
) -> np.ndarray:
    """Whole-life TPOT (ms) of each request whose last step is among these: from the end
    of its first step to the end of its last over its tokens after the first, as
    `analysis.metrics.tpot_ms` (requests with o >= 2 that the run admitted; not those it
    started with, whose first token it never saw)."""
    requests = view["admit_step"].shape[0]
    if run.first_end_ms.shape[0] < requests:
        grown = np.full(max(requests, 2 * run.first_end_ms.shape[0]), np.nan)
        grown[: run.first_end_ms.shape[0]] = run.first_end_ms
        run.first_end_ms = grown
    if g1 < g0:
        return np.empty(0)
    admit, finish = view["admit_step"], view["finish_step"]
    ran = np.arange(requests) >= run.fleet.initial_count
    started = ran & (admit >= g0) & (admit <= g1)
    run.first_end_ms[:requests][started] = steps.end_ms[admit[started] - g0]
    output = view["output_tokens"]
    done = ran & (admit >= 0) & (finish >= g0) & (finish <= g1) & (output >= 2)
    last = steps.end_ms[finish[done] - g0]
    return (last - run.first_end_ms[:requests][done]) / (output[done] - 1)


def _busy_ms(run: _Run, w1: float) -> float:
    """How far the run's busy clock moved in this window. The clock stands at the window's
    end while the run has work (running, waiting, or an arrival still to come), else at
    the end of its last step: summed over windows it is the run's time from the start to
    its last step end, idle gaps between included, so tokens over it are a full replay's
    tokens over its makespan; a run that finished early stops its clock there, and one
    that drains past the last window's end runs it on."""
    fleet = run.fleet
    working = bool(
        fleet.fleet.active.size
        or fleet.pool.size
        or any(fleet.queues)
        or fleet.arrived < fleet.requests
    )
    clock = max(run.clock_ms, w1 if working else run.last_end_ms)
    busy, run.clock_ms = clock - run.clock_ms, clock
    return busy
