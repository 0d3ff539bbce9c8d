"""Windowed counterfactual replay: the paired samples the gate decides on.

The observed timeline is cut into windows (default 30 s of fleet time). A window starts
at a step boundary, after the completions of the step that crossed the nominal boundary
and before the next step's dispatches, so its start snapshot is exactly what the next
admission round saw. Every policy is replayed from that snapshot (active requests with
their prompt, generated-so-far and true remaining length) with the window's arrivals at
their observed times, on the calibrated step model. A window is evaluated once every
request in it has finished, or after `max_lag_s` with the unfinished lengths imputed by
the Survival predictor (the window is flagged).

The window's fleet is the one at its start: a worker that is down is left out, a draining
one decodes what it holds and takes nothing new, and each worker keeps its own B. Engine
steps are keyed per worker (each engine counts its own); the observed fleet at a moment is
each worker's step covering it. A policy round that raises is counted and answered with
Round-Robin (`GuardedPolicy`), as live routing answers it. The A/A run is the incumbent
with other tie-break draws on a relabelled fleet (workers in a shuffled order), so
Round-Robin has a noise floor too; where that moves nothing (a rule without ties, such as
BR-0), the arrivals are drawn again up to one step later, which moves only the round
that first sees each request.

Window metrics cover the steps that start inside the window. A window's replay holds
only its own arrivals, so whatever runs past its end meets a lighter fleet than it really
did; every metric is therefore measured inside the window, for the observed and the
replayed run alike. A window whose dispatches landed mid-step (a live router decides on
arrival) is replayed deciding on arrival; one whose dispatches fell on step boundaries (a
recorded replay) round by round. TPOT is per request that decoded in the window: the time
between its first and last token inside the window over the tokens between them (requests
with at least two tokens there; a request still waiting has none). Pool wait is over the
window's arrivals. `evaluate_window` is a pure function of a picklable `WindowSpec`, so it
can run in a worker process off the ingest path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from shadow.events import STEP_END_KINDS
from shadow.policies import (
    NO_KEY,
    ActiveSet,
    BalanceRouteConfig,
    Policy,
    make_aa_policy,
    make_policy,
)
from shadow.predict.predictors import SurvivalPredictor
from shadow.replay import InitialRequest, replay
from shadow.replay.workload import StepModel, Workload
from shadow.stream.aa import jitter_step_s, jittered, relabelled
from shadow.stream.guard import GuardedPolicy
from shadow.stream.mirror import FleetMirror
from shadow.stream.trajectory import Trajectory, bucket
from shadow.stream.window_metrics import (  # WINDOW_METRICS: re-exported, as before
    WINDOW_METRICS,  # noqa: F401
    SealedSteps,
    observed_window,
    span_metrics,
    tpot_inside,
)
from shadow.stream.window_state import RunningAtStart, TrackedRequest, TrackedWindow

OBSERVED = "observed"
#: the incumbent replayed against itself with other tie-breaks (the A/A noise floor)
AA = "aa"
IMPUTE_HORIZON = 1_000_000


@dataclass(frozen=True)
class WindowConfig:
    length_s: float = field(default=30.0, metadata={"gt": 0})  # metadata: configured bounds
    max_lag_s: float = field(default=600.0, metadata={"gt": 0})
    policies: tuple[str, ...] = ("jsq-pool", "random", "br0", "brh-survival", "brh-oracle")
    incumbent: str = "jsq-pool"
    history_limit: int = 20_000
    balance_route: BalanceRouteConfig = field(default_factory=BalanceRouteConfig)
    #: "continuous": each policy's own fleet runs on from the evidence's start, fed every
    #: window's arrivals (stream/continuous.py); "reset": each window replayed from its
    #: observed start with only its arrivals (kept to compare, and for a single window)
    mode: Literal["continuous", "reset"] = "continuous"
    #: continuous runs keep the step model they started with; a refit that would predict
    #: a step they took this much (relative) differently starts them again (GATE.md)
    step_model_restart: float = field(default=0.01, metadata={"gt": 0})


@dataclass(frozen=True)
class WindowSpec:
    """Everything needed to evaluate one window, as plain data."""

    fleet: str
    index: int
    t_start: float
    t_end: float
    workers: int
    batch: int
    step_model: StepModel
    policies: tuple[str, ...]
    incumbent: str
    balance_route: BalanceRouteConfig
    initial: tuple[InitialRequest, ...]
    arrivals: Workload
    observed: dict[str, float]
    history: np.ndarray
    imputed: int
    #: replay the window as its dispatches were observed: decided on arrival, mid-step
    decide_on_arrival: bool = False
    observed_trajectory: Trajectory | None = None
    #: slots per worker (None: `batch` each); 0 for a draining worker
    capacity: tuple[int, ...] | None = None
    #: prompt keys of `history` (ExactMatch learns by key)
    history_keys: np.ndarray | None = None
    #: the first `pool` of `arrivals` were waiting at the window's start (arrived before)
    pool: int = 0
    #: the evidence's last window (the end of a recorded log): no arrival follows, so
    #: continuous runs drain inside it
    final: bool = False
    #: `step_model` is fitted from the fleet's steps (False: the configured default)
    step_model_fitted: bool = True
    #: WindowConfig.step_model_restart
    step_model_restart: float = 0.01


@dataclass(frozen=True)
class WindowResult:
    fleet: str
    index: int
    t_start: float
    t_end: float
    requests: int
    imputed: int
    step_model: StepModel
    metrics: dict[str, dict[str, float]]  # policy (and "observed") -> metric -> value
    fidelity_imbalance: float
    fidelity_step: float
    #: policy (and "observed") -> bucketed per-worker load path (the A/A run has none)
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    #: policy -> (rounds that raised, the first error) in this window's replay
    errors: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: continuous runs: the window they started from; None: replayed on its own
    run_start: int | None = None
    #: continuous runs: the requests their start state held (0: an empty fleet)
    run_start_held: int | None = None
    #: policy -> per-request TPOTs (ms) the gate pools for the TPOT P95 over requests:
    #: a continuous run's requests that finished in the window, whole life; a reset
    #: window's requests that decoded in it, inside it
    tpot_ms: dict[str, np.ndarray] = field(default_factory=dict)


def taught(policy: Policy, spec: WindowSpec) -> Policy:
    """`policy` with its predictor (if it learns: not the oracle) taught the completed
    lengths the window hands over, keyed for ExactMatch."""
    predictor = getattr(policy, "predictor", None)
    if predictor is not None and predictor.name != "oracle" and spec.history.size:
        predictor.observe_many(spec.history, spec.history_keys)
    return policy


def evaluate_window(spec: WindowSpec) -> WindowResult:
    """Replay every policy from the window's start snapshot; compare with what happened."""
    span_ms = (spec.t_end - spec.t_start) * 1000.0
    metrics: dict[str, dict[str, float]] = {OBSERVED: spec.observed}
    trajectories: dict[str, Trajectory] = {}
    if spec.observed_trajectory is not None:
        trajectories[OBSERVED] = spec.observed_trajectory
    trace_count = len(spec.arrivals)
    capacity = spec.capacity if spec.capacity is not None else (spec.batch,) * spec.workers
    errors: dict[str, tuple[int, str]] = {}
    tpots: dict[str, np.ndarray] = {}

    def run(
        name: str,
        policy: Policy,
        initial: tuple[InitialRequest, ...],
        slots: tuple[int, ...],
        arrivals: Workload,
    ) -> None:
        """Replay one policy and measure it inside the window."""
        guarded = GuardedPolicy(taught(policy, spec))
        result = replay(
            arrivals,
            guarded,
            workers=spec.workers,
            batch=spec.batch,
            step_model=spec.step_model,
            initial=initial,
            decide_on_arrival=spec.decide_on_arrival,
            capacity=slots,
        )
        if guarded.errors:
            errors[name] = (guarded.errors, guarded.error)
        inside = result.step_start_ms < span_ms
        ends = result.step_end_ms[inside]
        last_step = ends.shape[0] - 1
        first = np.maximum(result.admit_step, 0)
        last = np.minimum(result.finish_step, last_step)
        tpot = tpot_inside(ends, first, last)
        trace = np.arange(result.output_tokens.shape[0]) < trace_count
        wait = result.admit_ms[trace] - result.ready_ms[trace]
        metrics[name] = span_metrics(
            result.step_start_ms[inside],
            result.step_duration_ms[inside],
            result.worker_load[inside],
            result.worker_active[inside].sum(axis=1),
            span_ms / 1000.0,
            tpot,
            wait,
        )
        tpots[name] = tpot
        if name != AA:
            trajectories[name] = bucket(
                result.step_start_ms[inside],
                result.step_duration_ms[inside],
                result.worker_load[inside],
                span_ms,
            )

    for name in spec.policies:
        run(name, make_policy(name, config=spec.balance_route), spec.initial, capacity,
            spec.arrivals)  # fmt: skip
    if spec.incumbent in spec.policies:
        seed = spec.index + 1
        moved, slots = relabelled(spec.initial, capacity, seed=seed)
        run(AA, make_aa_policy(spec.incumbent, seed=seed), moved, slots, spec.arrivals)
        if metrics[AA] == metrics[spec.incumbent]:
            # nothing arbitrary left to draw (a rule without ties): draw the arrival
            # times again within a step instead, a difference no router could act on
            step_s = jitter_step_s(spec.observed, spec.step_model.b_ms)
            later = jittered(spec.arrivals, step_s, seed)
            run(AA, make_aa_policy(spec.incumbent, seed=seed), moved, slots, later)
    fidelity_imbalance, fidelity_step = fidelity(metrics, spec)
    return WindowResult(
        spec.fleet,
        spec.index,
        spec.t_start,
        spec.t_end,
        len(spec.initial) + trace_count,
        spec.imputed,
        spec.step_model,
        metrics,
        fidelity_imbalance,
        fidelity_step,
        trajectories,
        errors,
        tpot_ms=tpots,
    )


def fidelity(metrics: dict[str, dict[str, float]], spec: WindowSpec) -> tuple[float, float]:
    """The replayed incumbent against the observed fleet: (imbalance, step time) ratios,
    NaN where the incumbent was not replayed."""
    incumbent = metrics.get(spec.incumbent)
    if incumbent is None:
        return math.nan, math.nan
    return (
        ratio(incumbent["imbalance_mean"], spec.observed["imbalance_mean"]),
        ratio(incumbent["step_ms_mean"], spec.observed["step_ms_mean"]),
    )


def ratio(a: float, b: float) -> float:
    """a / b, 1 for 0 / 0, inf for x / 0, NaN when either is NaN."""
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b if not (math.isnan(a) or math.isnan(b)) else math.nan


class WindowTracker:
    """Cuts one fleet's applied event stream into windows and builds their specs."""

    def __init__(self, fleet: str, mirror: FleetMirror, config: WindowConfig | None = None):
        self.fleet = fleet
        self.mirror = mirror
        self.config = config or WindowConfig()
        self.windows: dict[int, TrackedWindow] = {}
        self.current: TrackedWindow | None = None
        self.requests: dict[str, TrackedRequest] = {}
        self._next_boundary: float | None = None
        self._pending_cut: float | None = None
        self._has_steps = False
        self._last_step_end: float | None = None
        self._count = 0
        #: (output tokens, prompt key) of recent natural completions, oldest first
        self._history: list[tuple[int, int]] = []

    # -- the applied stream ---------------------------------------------------------

    def before_event(self, kind: str, ts: float) -> None:
        """Call before the mirror applies each event: cuts windows at step boundaries.

        With step telemetry, a window ends only where a step ends (after that step's
        completions, before the next dispatches), never inside a step; other events cross
        the nominal boundary freely. Only an idle fleet (nothing decoding), or one without
        step telemetry, is cut at the nominal boundary itself.
        """
        if self._next_boundary is None:
            self._open(ts)
            return
        window = self.current
        if window is not None and window.t_end is not None:
            # Ended early by `close` (a quiet fleet, on a flush): what comes now belongs
            # to the next window, from that end on. Left current, the closed window took
            # the next arrivals after it was evaluated: they were in no window's evidence.
            self._pending_cut = None
            self._open(window.t_end)
            return
        if window is not None and window.t_end is None and not window.used:
            if window.blank():
                # Nothing has happened in it yet but fleet changes (the workers of a
                # recorded log come up after its first event opened the window): its start
                # state is the fleet as it is now, or the window would start with no
                # workers and be discarded, and with it the start of the evidence.
                self._reopen(window)
            else:
                window.used = True  # an open window holds what it took: never blank again
        if self._pending_cut is not None:
            same_step = ts == self._pending_cut and kind in STEP_END_KINDS
            if not same_step:
                self._open(self._pending_cut)
                self._pending_cut = None
            return
        if kind == "engine_step":
            self._has_steps = True
        if ts < self._next_boundary:
            return
        if kind == "engine_step":
            self._pending_cut = ts  # cut after this step's completions
        elif not self._has_steps or not any(w.active for w in self.mirror.order):
            self._open(self._next_boundary)

    def _open(self, t_start: float) -> None:
        if self.current is not None:
            self.current.t_end = t_start
        mirror = self.mirror
        # The window's fleet: every worker but those down; a draining one takes nothing new.
        fleet = [w for w in mirror.order if w.state != "down"]
        position = {w.index: g for g, w in enumerate(fleet)}
        ids: list[str] = []
        on_worker: list[int] = []
        generated: list[int] = []
        held = []
        for worker in fleet:
            for request in worker.active.values():
                ids.append(request.request_id)
                on_worker.append(position[worker.index])
                generated.append(request.generated())
                held.append(self._track(request.request_id, request.prompt_tokens,
                                        request.prompt_key))  # fmt: skip
        pool = list(mirror.pool)
        for rid in pool:
            request = mirror.pool[rid]
            info = self._track(rid, request.prompt_tokens, request.prompt_key)
            info.ready_ts = request.ready_ts
            held.append(info)
        capacity = tuple(max(0, w.capacity) if w.accepting else 0 for w in fleet)
        recent = self._history[-self.config.history_limit :]
        running = RunningAtStart(ids, np.array(on_worker, dtype=np.int32),
                                 np.array(generated, dtype=np.int64))  # fmt: skip
        window = TrackedWindow(
            self._count,
            t_start,
            tuple(w.worker_id for w in fleet),
            max(capacity, default=0),
            running,
            pool,
            capacity=capacity,
            history=np.array([length for length, _ in recent], dtype=np.int64),
            history_keys=np.array([key for _, key in recent], dtype=np.int64),
        )
        for info in held:
            self._hold(window, info)
        self.windows[window.index] = window
        self.current = window
        self._count += 1
        self._next_boundary = t_start + self.config.length_s
        self._seal(window.index - 2)

    def _seal(self, index: int) -> None:
        """A step goes to the open window or the one before it (`on_engine_step`), so
        once two later windows are open, window `index` holds all of its steps: keep
        them as columns while it waits for its requests to finish."""
        window = self.windows.get(index)
        if window is not None and window.sealed is None:
            window.sealed = SealedSteps.of(window.steps, window.t_start)
            window.steps = {}

    def _reopen(self, window: TrackedWindow) -> None:
        """Take the start state of a window that holds nothing yet again, from now."""
        del self.windows[window.index]
        self.current = None
        self._count = window.index
        self._open(window.t_start)

    def _track(self, request_id: str, prompt: int, key: int) -> TrackedRequest:
        """The tracked request `request_id` (new if none), about to be held by a window."""
        info = self.requests.get(request_id)
        if info is None:
            info = TrackedRequest(prompt, key)
            self.requests[request_id] = info
        return info

    @staticmethod
    def _hold(window: TrackedWindow, info: TrackedRequest) -> None:
        if info.hold(window.index) and info.output is None:
            window.unfinished += 1

    def on_ready(self, ts: float, request_id: str) -> None:
        request = self.mirror.requests.get(request_id)
        if self.current is None or request is None:
            return
        info = self._track(request_id, request.prompt_tokens, request.prompt_key)
        info.ready_ts = ts
        self.current.arrivals.append(request_id)
        self._hold(self.current, info)

    def on_dispatch(self, ts: float, request_id: str) -> None:
        if self.current is not None and self._last_step_end is not None:
            if abs(ts - self._last_step_end) <= 1e-6:
                self.current.on_boundary += 1
            else:
                self.current.mid_step += 1
        info = self.requests.get(request_id)
        if info is not None and info.dispatch_ts is None:
            info.dispatch_ts = ts

    def on_finish(self, ts: float, request_id: str, output_tokens: int, natural: bool) -> None:
        info = self.requests.get(request_id)
        if info is not None:
            if info.output is None:
                for index in info.held_by():
                    self.windows[index].unfinished -= 1
            info.finish_ts = ts
            info.output = output_tokens
        if natural:
            key = info.key if info is not None else self._key_of(request_id)
            self._history.append((output_tokens, key))
            if len(self._history) > 2 * self.config.history_limit:
                del self._history[: -self.config.history_limit]

    def _key_of(self, request_id: str) -> int:
        request = self.mirror.requests.get(request_id)
        return int(request.prompt_key) if request is not None else int(NO_KEY)

    def completed_lengths(self) -> list[int]:
        """Output lengths of the fleet's recent natural completions (oldest first)."""
        return [length for length, _ in self._history]

    def on_engine_step(
        self, ts: float, worker_id: str, step: int, duration_ms: float, running: int, kv: int
    ) -> None:
        start = ts - duration_ms / 1000.0
        self._last_step_end = ts
        window = self.current
        if window is None:
            return
        if start < window.t_start - 1e-9 and window.index - 1 in self.windows:
            window = self.windows[window.index - 1]
        if worker_id not in window.workers:
            return
        # keyed by the worker and its own step number: engines count steps apart (and
        # from 0 again after a restart), so a step number alone names no fleet-wide step
        window.steps[(window.workers.index(worker_id), step)] = (start, duration_ms, kv, running)

    # -- evaluation -----------------------------------------------------------------

    def due(self, now: float, *, force: bool = False) -> list[int]:
        """Closed windows whose requests all finished, or that waited past the lag; with
        `force` (the end of a recorded log: no finish will come) every closed window,
        its unfinished lengths imputed."""
        ready = []
        for index, window in list(self.windows.items()):
            if window.t_end is None:
                continue
            if not window.workers or not window.batch or not window.holds_requests():
                # nothing ran, or no worker took requests: no sample to compare
                self.discard(index)
                continue
            done = window.unfinished == 0
            if force or done or now - window.t_end > self.config.max_lag_s:
                ready.append(index)
        return ready

    def spec(self, index: int, step_model: StepModel, fitted: bool = True) -> WindowSpec:
        """Build the spec of a due window and forget it (`fitted`: `step_model` is a fit
        of the fleet's steps, not the configured default)."""
        window = self.windows.pop(index)
        assert window.t_end is not None
        imputer = SurvivalPredictor()
        if window.history.size:
            imputer.observe_many(window.history)
        imputed = 0

        def final_length(info: TrackedRequest, generated: int) -> int:
            nonlocal imputed
            if info.output is not None:
                return max(info.output, generated + 1)
            imputed += 1
            seen = max(generated, info.progress)
            expected = imputer.predict(
                ActiveSet.from_arrays([0], [0], [seen]), IMPUTE_HORIZON
            ).contribution[0]
            return seen + max(1, round(float(expected)))

        initial = []
        for rid, worker_index, generated in window.initial:
            info = self.requests[rid]
            total = final_length(info, generated)
            initial.append(
                InitialRequest(worker_index, info.prompt, generated, total - generated, info.key)
            )
        ready, prompts, outputs, keys = [], [], [], []
        for rid in window.pool + window.arrivals:
            info = self.requests[rid]
            offset = 0.0 if info.ready_ts is None else max(0.0, info.ready_ts - window.t_start)
            ready.append(offset)
            prompts.append(info.prompt)
            outputs.append(final_length(info, 0))
            keys.append(info.key)
        arrivals = Workload.from_arrays(f"window-{index}", ready, prompts, outputs, keys)
        observed, observed_path = self._observed(window)
        self._release_refs(window)
        return WindowSpec(
            self.fleet,
            index,
            window.t_start,
            window.t_end,
            len(window.workers),
            window.batch,
            step_model,
            self.config.policies,
            self.config.incumbent,
            self.config.balance_route,
            tuple(initial),
            arrivals,
            observed,
            window.history,
            imputed,
            decide_on_arrival=window.mid_step > window.on_boundary,
            observed_trajectory=observed_path,
            capacity=window.capacity,
            history_keys=window.history_keys,
            pool=len(window.pool),
            final=window.final,
            step_model_fitted=fitted,
            step_model_restart=self.config.step_model_restart,
        )

    def close(self, t_end: float, *, final: bool = False) -> None:
        """End the open window at `t_end` (a quiet fleet, or with `final` the end of a
        recorded log: the window not yet evaluated is then the evidence's last)."""
        window = self.current
        if window is not None and window.t_end is None and t_end > window.t_start:
            window.t_end = t_end
        if final and window is not None and window.index in self.windows:
            window.final = True

    def discard(self, index: int) -> None:
        """Forget a window without evaluating it (already stored before a restart)."""
        self._release_refs(self.windows.pop(index))

    def _release_refs(self, window: TrackedWindow) -> None:
        for rid in window.request_ids():
            info = self.requests.get(rid)
            if info is not None and not info.release(window.index):
                del self.requests[rid]

    def _observed(self, window: TrackedWindow) -> tuple[dict[str, float], Trajectory]:
        assert window.t_end is not None
        steps = window.sealed if window.sealed is not None else window.steps
        return observed_window(
            steps, window.t_start, window.t_end, len(window.workers),
            window.request_ids(), window.pool + window.arrivals, self.requests,
        )  # fmt: skip
