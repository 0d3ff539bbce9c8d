"""Windowed counterfactual replay: the paired samples the gate decides on.

The observed timeline is cut into windows (default 30 s of fleet time). A window starts
at a step boundary, after the completions of the step that crossed the nominal boundary
and before the next step's dispatches, so its start snapshot is exactly what the next
admission round saw. Every policy is replayed from that snapshot (active requests with
their prompt, generated-so-far and true remaining length) with the window's arrivals at
their observed times, on the calibrated step model. A window is evaluated once every
request in it has finished, or after `max_lag_s` with the unfinished lengths imputed by
the Survival predictor (the window is flagged).

Window metrics cover the steps that start inside the window. A window's replay holds
only its own arrivals, so whatever runs past its end meets a lighter fleet than it really
did; every metric is therefore measured inside the window, for the observed and the
replayed run alike. A window whose dispatches landed mid-step (a live router decides on
arrival) is replayed deciding on arrival; one whose dispatches fell on step boundaries (a
recorded replay) round by round. TPOT is per request active in the window: the time
between its first
and last token inside the window over the tokens between them (requests with at least two
tokens there). Pool wait is over the window's arrivals.
`evaluate_window` is a pure function of a picklable `WindowSpec`, so it can run in a
worker process off the ingest path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from shadow.events import STEP_END_KINDS
from shadow.policies import ActiveSet, BalanceRouteConfig, make_aa_policy, make_policy
from shadow.predict.predictors import SurvivalPredictor
from shadow.replay import InitialRequest, replay
from shadow.replay.workload import StepModel, Workload
from shadow.stream.mirror import FleetMirror
from shadow.stream.trajectory import Trajectory, bucket

WINDOW_METRICS = (
    "imbalance_mean",
    "gap_mean",
    "step_ms_mean",
    "throughput_tok_s",
    "tpot_p95_ms",
    "pool_wait_p95_ms",
    "steps",
)
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


@dataclass
class _Request:
    prompt: int
    key: int
    ready_ts: float | None = None
    dispatch_ts: float | None = None
    finish_ts: float | None = None
    output: int | None = None
    progress: int = 0
    refs: int = 0


@dataclass
class _Window:
    index: int
    t_start: float
    workers: tuple[str, ...]
    batch: int
    initial: list[tuple[str, int, int]]  # request, worker index, generated at start
    pool: list[str]
    arrivals: list[str] = field(default_factory=list)
    t_end: float | None = None
    steps: dict[int, dict[int, int]] = field(default_factory=dict)  # step -> worker -> kv
    step_start: dict[int, float] = field(default_factory=dict)
    step_duration: dict[int, float] = field(default_factory=dict)
    step_running: dict[int, int] = field(default_factory=dict)
    history: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    #: dispatches that landed exactly on a step boundary, and those in the middle of a step
    on_boundary: int = 0
    mid_step: int = 0

    def request_ids(self) -> list[str]:
        return [rid for rid, _, _ in self.initial] + self.pool + self.arrivals


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


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def _span_metrics(
    starts: np.ndarray,
    durations: np.ndarray,
    loads: np.ndarray,
    running: np.ndarray,
    span_s: float,
    tpot: np.ndarray,
    wait: np.ndarray,
) -> dict[str, float]:
    if loads.size:
        top, bottom = loads.max(axis=1), loads.min(axis=1)
        imbalance = float((top - bottom).mean())
        gap = float((loads.shape[1] * top - loads.sum(axis=1)).mean())
        step = float(durations.mean())
    else:
        imbalance = gap = step = math.nan
    return {
        "imbalance_mean": imbalance,
        "gap_mean": gap,
        "step_ms_mean": step,
        "throughput_tok_s": float(running.sum()) / span_s if span_s > 0 else math.nan,
        "tpot_p95_ms": _percentile(tpot, 95),
        "pool_wait_p95_ms": _percentile(wait, 95),
        "steps": float(starts.shape[0]),
    }


def evaluate_window(spec: WindowSpec) -> WindowResult:
    """Replay every policy from the window's start snapshot; compare with what happened."""
    span_ms = (spec.t_end - spec.t_start) * 1000.0
    metrics: dict[str, dict[str, float]] = {OBSERVED: spec.observed}
    trajectories: dict[str, Trajectory] = {}
    if spec.observed_trajectory is not None:
        trajectories[OBSERVED] = spec.observed_trajectory
    trace_count = len(spec.arrivals)
    runs = [(name, None) for name in spec.policies]
    if spec.incumbent in spec.policies:
        runs.append((AA, make_aa_policy(spec.incumbent, seed=spec.index + 1)))
    for name, given in runs:
        predictor = None
        if name in ("brh-survival", "brh-exactmatch"):
            predictor = make_policy(name).predictor  # type: ignore[attr-defined]
            if spec.history.size:
                predictor.observe_many(spec.history)
        policy = given or make_policy(name, config=spec.balance_route, predictor=predictor)
        result = replay(
            spec.arrivals,
            policy,
            workers=spec.workers,
            batch=spec.batch,
            step_model=spec.step_model,
            initial=spec.initial,
            decide_on_arrival=spec.decide_on_arrival,
        )
        inside = result.step_start_ms < span_ms
        ends = result.step_end_ms[inside]
        last_step = ends.shape[0] - 1
        first = np.maximum(result.admit_step, 0)
        last = np.minimum(result.finish_step, last_step)
        tpot = _tpot_inside(ends, first, last)
        trace = np.arange(result.output_tokens.shape[0]) < trace_count
        wait = result.admit_ms[trace] - result.ready_ms[trace]
        metrics[name] = _span_metrics(
            result.step_start_ms[inside],
            result.step_duration_ms[inside],
            result.worker_load[inside],
            result.worker_active[inside].sum(axis=1),
            span_ms / 1000.0,
            tpot,
            wait,
        )
        if name != AA:
            trajectories[name] = bucket(
                result.step_start_ms[inside],
                result.step_duration_ms[inside],
                result.worker_load[inside],
                span_ms,
            )
    incumbent = metrics.get(spec.incumbent)
    fidelity_imbalance = fidelity_step = math.nan
    if incumbent is not None:
        fidelity_imbalance = _ratio(incumbent["imbalance_mean"], spec.observed["imbalance_mean"])
        fidelity_step = _ratio(incumbent["step_ms_mean"], spec.observed["step_ms_mean"])
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
    )


def _tpot_inside(ends: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per request, mean ms per token between its first and last step inside the window
    (`first`/`last` index `ends`; requests with fewer than two steps there are skipped)."""
    keep = (last - first >= 1) & (first >= 0) & (last < ends.shape[0])
    if not keep.any():
        return np.empty(0)
    return (ends[last[keep]] - ends[first[keep]]) / (last[keep] - first[keep])


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b if not (math.isnan(a) or math.isnan(b)) else math.nan


class WindowTracker:
    """Cuts one fleet's applied event stream into windows and builds their specs."""

    def __init__(self, fleet: str, mirror: FleetMirror, config: WindowConfig | None = None):
        self.fleet = fleet
        self.mirror = mirror
        self.config = config or WindowConfig()
        self.windows: dict[int, _Window] = {}
        self.current: _Window | None = None
        self.requests: dict[str, _Request] = {}
        self._next_boundary: float | None = None
        self._pending_cut: float | None = None
        self._has_steps = False
        self._last_step_end: float | None = None
        self._count = 0
        self._history: list[int] = []

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
        initial = []
        for worker in mirror.order:
            for request in worker.active.values():
                initial.append((request.request_id, worker.index, request.generated()))
                self._track(request.request_id, request.prompt_tokens, request.prompt_key)
        pool = list(mirror.pool)
        for rid in pool:
            request = mirror.pool[rid]
            info = self._track(rid, request.prompt_tokens, request.prompt_key)
            info.ready_ts = request.ready_ts
        capacities = [w.capacity for w in mirror.order]
        window = _Window(
            self._count,
            t_start,
            tuple(w.worker_id for w in mirror.order),
            max(capacities, default=0),
            initial,
            pool,
            history=np.array(self._history[-self.config.history_limit :], dtype=np.int64),
        )
        self.windows[window.index] = window
        self.current = window
        self._count += 1
        self._next_boundary = t_start + self.config.length_s

    def _track(self, request_id: str, prompt: int, key: int) -> _Request:
        info = self.requests.get(request_id)
        if info is None:
            info = _Request(prompt, key)
            self.requests[request_id] = info
        info.refs += 1
        return info

    def on_ready(self, ts: float, request_id: str) -> None:
        request = self.mirror.requests.get(request_id)
        if self.current is None or request is None:
            return
        info = self._track(request_id, request.prompt_tokens, request.prompt_key)
        info.ready_ts = ts
        self.current.arrivals.append(request_id)

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
            info.finish_ts = ts
            info.output = output_tokens
        if natural:
            self._history.append(output_tokens)
            if len(self._history) > 2 * self.config.history_limit:
                del self._history[: -self.config.history_limit]

    def completed_lengths(self) -> list[int]:
        """Output lengths of the fleet's recent natural completions (oldest first)."""
        return list(self._history)

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
        g = window.workers.index(worker_id)
        window.steps.setdefault(step, {})[g] = kv
        window.step_start.setdefault(step, start)
        window.step_duration[step] = max(window.step_duration.get(step, 0.0), duration_ms)
        window.step_running[step] = window.step_running.get(step, 0) + running

    # -- evaluation -----------------------------------------------------------------

    def due(self, now: float) -> list[int]:
        """Closed windows whose requests all finished, or that waited past the lag."""
        ready = []
        for index, window in list(self.windows.items()):
            if window.t_end is None:
                continue
            if not window.workers or not window.batch or not window.request_ids():
                self.discard(index)  # nothing ran: no sample to compare
                continue
            done = all(
                self.requests[rid].output is not None
                for rid in window.request_ids()
                if rid in self.requests
            )
            if done or now - window.t_end > self.config.max_lag_s:
                ready.append(index)
        return ready

    def spec(self, index: int, step_model: StepModel) -> WindowSpec:
        """Build the spec of a due window and forget it."""
        window = self.windows.pop(index)
        assert window.t_end is not None
        imputer = SurvivalPredictor()
        if window.history.size:
            imputer.observe_many(window.history)
        imputed = 0

        def final_length(info: _Request, generated: int) -> int:
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
        )

    def close(self, t_end: float) -> None:
        """End the open window at `t_end` (the end of a recorded log)."""
        window = self.current
        if window is not None and window.t_end is None and t_end > window.t_start:
            window.t_end = t_end

    def discard(self, index: int) -> None:
        """Forget a window without evaluating it (already stored before a restart)."""
        self._release_refs(self.windows.pop(index))

    def _release_refs(self, window: _Window) -> None:
        for rid in window.request_ids():
            info = self.requests.get(rid)
            if info is not None:
                info.refs -= 1
                if info.refs <= 0:
                    del self.requests[rid]

    def _observed(self, window: _Window) -> tuple[dict[str, float], Trajectory]:
        assert window.t_end is not None
        steps = sorted(s for s in window.steps if window.step_start[s] >= window.t_start - 1e-9)
        workers = len(window.workers)
        loads = np.zeros((len(steps), workers), dtype=np.int64)
        for row, step in enumerate(steps):
            for g, kv in window.steps[step].items():
                loads[row, g] = kv
        running = np.array([window.step_running[s] for s in steps], dtype=np.int64)
        keep = running > 0  # steps with no active request are not steps
        starts = np.array([window.step_start[s] for s in steps])
        ends = starts + np.array([window.step_duration[s] for s in steps]) / 1000.0
        firsts, lasts, wait = [], [], []
        for rid in window.request_ids():
            info = self.requests.get(rid)
            if info is None:
                continue
            dispatched = -np.inf if info.dispatch_ts is None else info.dispatch_ts
            finished = np.inf if info.finish_ts is None else info.finish_ts
            firsts.append(np.searchsorted(starts, dispatched - 1e-9, side="left"))
            lasts.append(np.searchsorted(ends, finished + 1e-9, side="right") - 1)
        for rid in window.pool + window.arrivals:
            info = self.requests.get(rid)
            if info is not None and info.dispatch_ts is not None and info.ready_ts is not None:
                wait.append((info.dispatch_ts - max(info.ready_ts, window.t_start)) * 1000.0)
        tpot = _tpot_inside(ends * 1000.0, np.array(firsts, dtype=np.int64),
                            np.array(lasts, dtype=np.int64))  # fmt: skip
        durations = np.array([window.step_duration[s] for s in steps])
        span_s = window.t_end - window.t_start
        metrics = _span_metrics(
            starts[keep], durations[keep], loads[keep], running[keep], span_s, tpot,
            np.array(wait),
        )  # fmt: skip
        path = bucket(
            (starts[keep] - window.t_start) * 1000.0, durations[keep], loads[keep], span_s * 1000.0
        )
        return metrics, path
