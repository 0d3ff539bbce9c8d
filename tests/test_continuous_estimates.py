"""The gate's estimators over a continuous run's windows measure what a full replay's
`summarize` measures (issue 22): fed the same arrivals window by window, with the last
window draining the runs, tokens over the busy clock are the replay's throughput, the
step-weighted imbalance is its mean over steps, and the TPOT P95 of the requests pooled
across windows is its TPOT P95, for every policy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shadow.analysis.metrics import summarize
from shadow.gate.statistics import paired_percentile_bootstrap, paired_ratio_bootstrap
from shadow.policies import BalanceRouteConfig, make_policy
from shadow.replay import replay
from shadow.replay.workload import StepModel, Workload
from shadow.stream.continuous import ContinuousCounterfactuals
from shadow.stream.windows import AA, WINDOW_METRICS, WindowSpec
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime

WORKERS, BATCH, WINDOW_S = 4, 16, 30.0
MODEL = StepModel()
POLICIES = ("jsq-pool", "random", "br0", "rr", "jsq")


def _workload(load: float) -> Workload:
    work = generate("paper-azure2024", seed=5, n=700)
    return retime(work, load=load, workers=WORKERS, batch=BATCH, step_model=MODEL)


def _windows(
    work: Workload, models=None, runs: ContinuousCounterfactuals | None = None, after=None
) -> list:
    """Each 30 s of arrivals as one window of the continuous runs, the last one final;
    `models(k)`: window k's refit and whether it is a fit (default: MODEL, fitted);
    `after(runs)` is called after each window."""
    runs = runs or ContinuousCounterfactuals("f")
    ready = work.ready_s
    count = math.ceil(float(ready[-1]) / WINDOW_S) + 1
    results = []
    for k in range(count):
        t0, t1 = k * WINDOW_S, (k + 1) * WINDOW_S
        take = (ready >= t0) & (ready < t1)
        arrivals = Workload.from_arrays(
            f"w{k}", ready[take] - t0, work.prompt_tokens[take], work.output_tokens[take],
            work.prompt_keys[take],
        )  # fmt: skip
        model, fitted = models(k) if models is not None else (MODEL, True)
        spec = WindowSpec(
            fleet="f", index=k, t_start=t0, t_end=t1, workers=WORKERS, batch=BATCH,
            step_model=model, step_model_fitted=fitted, policies=POLICIES, incumbent="jsq-pool",
            balance_route=BalanceRouteConfig(), initial=(), arrivals=arrivals,
            observed=dict.fromkeys(WINDOW_METRICS, math.nan),
            history=np.empty(0, dtype=np.int64), imputed=0, final=k == count - 1,
        )  # fmt: skip
        results.append(runs.evaluate(spec))
        if after is not None:
            after(runs)
    return results


def _column(results, policy: str, key: str) -> np.ndarray:
    return np.array([r.metrics[policy][key] for r in results])


@pytest.mark.parametrize("load", [0.8, 1.1])
def test_the_window_estimators_are_the_full_replays_metrics(load):
    work = _workload(load)
    results = _windows(work)
    assert AA in results[0].metrics
    base = "jsq-pool"
    truth = {
        p: summarize(replay(work, make_policy(p), workers=WORKERS, batch=BATCH, step_model=MODEL))
        for p in POLICIES
    }
    weighted = {}
    for p in POLICIES:
        busy, steps = _column(results, p, "busy_s"), _column(results, p, "steps")
        thr, imb = _column(results, p, "throughput_tok_s"), _column(results, p, "imbalance_mean")
        tokens = np.where(busy > 0, thr * busy, 0.0)
        assert tokens.sum() / busy.sum() == pytest.approx(truth[p]["throughput_tok_s"], rel=1e-9)
        mean_imbalance = np.nansum(imb * steps) / steps.sum()
        assert mean_imbalance == pytest.approx(truth[p]["imbalance_mean"], rel=1e-9)
        pooled = np.concatenate([r.tpot_ms[p] for r in results])
        assert np.percentile(pooled, 95) == pytest.approx(truth[p]["tpot_p95_ms"], rel=1e-9)
        weighted[p] = (thr, busy, imb, steps)
    for p in POLICIES[1:]:
        # the gate's point estimates (its bootstraps' points) are the true ratios
        thr = paired_ratio_bootstrap(
            weighted[base][0], weighted[p][0], resamples=10,
            incumbent_weight=weighted[base][1], candidate_weight=weighted[p][1],
        )  # fmt: skip
        imb = paired_ratio_bootstrap(
            weighted[base][2], weighted[p][2], resamples=10,
            incumbent_weight=weighted[base][3], candidate_weight=weighted[p][3],
        )  # fmt: skip
        tpot = paired_percentile_bootstrap(
            [r.tpot_ms[base] for r in results], [r.tpot_ms[p] for r in results], resamples=10
        )
        for got, key in ((thr, "throughput_tok_s"), (imb, "imbalance_mean"),
                         (tpot, "tpot_p95_ms")):  # fmt: skip
            assert got.point == pytest.approx(truth[p][key] / truth[base][key], rel=1e-9), key


def test_the_busy_clock_sums_to_each_runs_makespan():
    work = _workload(1.1)
    results = _windows(work)
    makespans = set()
    for p in POLICIES:
        truth = summarize(
            replay(work, make_policy(p), workers=WORKERS, batch=BATCH, step_model=MODEL)
        )
        busy = _column(results, p, "busy_s")
        assert (busy >= 0).all()
        assert busy[:-2] == pytest.approx(WINDOW_S)  # while it has work: the window's span
        # the last window drains the run (past its end if it is slow), and a run that is
        # done stops its clock at its last step: the sum is the run's makespan
        assert busy.sum() == pytest.approx(truth["makespan_s"], rel=1e-12)
        makespans.add(round(truth["makespan_s"], 3))
    assert len(makespans) > 1  # the policies do finish at different times


def test_the_runs_keep_their_step_model_through_refits_within_the_threshold():
    """A replay is a function of its step model: refits 0.3% apart (within
    `step_model_restart`, 1%) leave the runs stepping, and the windows measuring, exactly
    what one model gives; the windows carry that model."""
    work = _workload(1.0)
    fixed = _windows(work)

    def refit(k: int) -> tuple[StepModel, bool]:
        scale = 1.0 + 0.003 * (k % 2)  # window 0 (the start): MODEL itself
        return StepModel(MODEL.a_ms_per_token * scale, MODEL.b_ms * scale), True

    refitted = _windows(work, refit)
    assert all(r.step_model == MODEL and r.run_start == 0 for r in refitted)
    for one, other in zip(fixed, refitted, strict=True):
        for policy in POLICIES:
            assert one.metrics[policy] == pytest.approx(other.metrics[policy], nan_ok=True)


def test_a_step_model_beyond_the_threshold_or_the_first_fit_starts_the_runs_again():
    """As a capacity change would: a refit 5% slower from window 3 on starts the runs
    there under it; a run started on the configured default moves to the first fit."""
    work = _workload(1.0)
    slower = StepModel(MODEL.a_ms_per_token * 1.05, MODEL.b_ms * 1.05)
    runs = ContinuousCounterfactuals("f")
    moved = _windows(work, lambda k: (MODEL if k < 3 else slower, True), runs)
    assert [r.run_start for r in moved[:4]] == [0, 0, 0, 3]
    assert {r.step_model for r in moved[3:]} == {slower} and runs.step_model_starts == 1
    default = StepModel(MODEL.a_ms_per_token * 0.5, MODEL.b_ms * 0.5)
    first_fit = _windows(work, lambda k: (default, False) if k < 2 else (MODEL, True))
    assert [r.run_start for r in first_fit[:3]] == [0, 0, 2]
    assert first_fit[0].step_model == default and first_fit[2].step_model == MODEL
    # a default never replaces a fit
    back = _windows(work, lambda k: (MODEL, True) if k < 2 else (default, False))
    assert {r.run_start for r in back} == {0} and {r.step_model for r in back} == {MODEL}


def test_dropping_the_measured_requests_changes_no_window():
    """The runs forget what finished in the windows measured (a run lives as long as the
    service): every window's metrics, TPOTs and trajectories are those of runs that keep
    every request, and the runs hold about the requests in flight, not all those fed."""
    work = _workload(1.0)
    held: list[int] = []
    kept: list[int] = []

    def count(into: list[int]):
        return lambda runs: into.append(max(run.fleet.requests for run in runs.runs))

    bounded = _windows(work, after=count(held))
    everything = _windows(work, runs=ContinuousCounterfactuals("f", keep_finished=True),
                          after=count(kept))  # fmt: skip
    assert len(bounded) == len(everything) > 5
    for one, other in zip(bounded, everything, strict=True):
        np.testing.assert_equal(one.metrics, other.metrics)
        np.testing.assert_equal(one.tpot_ms, other.tpot_ms)
        assert one.trajectories.keys() == other.trajectories.keys()
        for name, path in one.trajectories.items():
            np.testing.assert_equal(vars(path), vars(other.trajectories[name]))
    assert kept[-2] > 600  # nearly every request fed, before the last window drains
    assert max(held) < 2 * WORKERS * BATCH + 50 < kept[-2]
