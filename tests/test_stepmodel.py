import math

import numpy as np
import pytest

from shadow.analysis.stepmodel import StepModelFit, fit_step_model
from shadow.replay.workload import StepModel

A, B = 1.2e-4, 20.0


def loads(n: int, seed: int = 0) -> np.ndarray:
    """Max KV tokens at the barrier: 20k..400k, as on a busy B = 64 fleet."""
    return np.random.default_rng(seed).integers(20_000, 400_000, n).astype(np.float64)


def ols(m: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(m, t, 1)
    return float(slope), float(intercept)


def rel(value: float, truth: float) -> float:
    return abs(value / truth - 1.0)


def test_exact_recovery_on_noiseless_data():
    m = loads(500)
    fit = fit_step_model(m, A * m + B)
    assert not fit.fallback and fit.reason == "fit"
    assert fit.a_ms_per_token == pytest.approx(A, rel=1e-9)
    assert fit.b_ms == pytest.approx(B, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.n == 500
    assert fit.as_step_model() == StepModel(fit.a_ms_per_token, fit.b_ms)


def test_noiseless_majority_is_recovered_exactly_despite_outliers():
    # Over half the residuals are exactly zero (MAD = 0): the line through them wins.
    m = loads(1000, seed=1)
    t = A * m + B
    t[::20] *= 10
    fit = fit_step_model(m, t)
    assert fit.a_ms_per_token == pytest.approx(A, rel=1e-6)
    assert fit.b_ms == pytest.approx(B, rel=1e-6)


def test_recovery_with_gaussian_noise_within_two_percent():
    rng = np.random.default_rng(2)
    m = loads(5000, seed=2)
    t = A * m + B + rng.normal(0.0, 2.0, m.shape[0])
    fit = fit_step_model(m, t)
    assert rel(fit.a_ms_per_token, A) < 0.02
    assert rel(fit.b_ms, B) < 0.02
    assert 0.9 < fit.r2 < 1.0


def test_robust_to_five_percent_ten_times_slower_steps():
    rng = np.random.default_rng(3)
    m = loads(20_000, seed=3)
    t = A * m + B + rng.normal(0.0, 1.0, m.shape[0])
    gc_pause = rng.random(m.shape[0]) < 0.05
    t[gc_pause] *= 10
    ols_a, ols_b = ols(m, t)
    assert rel(ols_a, A) > 0.10 and rel(ols_b, B) > 0.10  # the test can fail
    fit = fit_step_model(m, t)
    assert not fit.fallback
    assert rel(fit.a_ms_per_token, A) < 0.03
    assert rel(fit.b_ms, B) < 0.03
    assert fit.r2 > 0.95  # on the inliers: the pauses do not hide a good fit


def test_deterministic_including_the_subsampled_scale():
    rng = np.random.default_rng(4)
    m = loads(250_000, seed=4)
    t = A * m + B + rng.normal(0.0, 1.0, m.shape[0])
    t[rng.random(m.shape[0]) < 0.05] += 500.0
    first = fit_step_model(m, t, ts=np.arange(m.shape[0]) * 0.06)
    second = fit_step_model(m.copy(), t.copy(), ts=np.arange(m.shape[0]) * 0.06)
    assert first == second
    assert rel(first.a_ms_per_token, A) < 0.03 and rel(first.b_ms, B) < 0.03


def assert_fallback(fit: StepModelFit, default: StepModel, reason: str) -> None:
    assert fit.fallback
    assert fit.reason == reason or fit.reason.startswith(reason), fit.reason
    assert (fit.a_ms_per_token, fit.b_ms) == (default.a_ms_per_token, default.b_ms)
    assert math.isnan(fit.r2)
    assert fit.as_step_model() == default


def test_fallback_too_few_steps():
    m = loads(12)
    fit = fit_step_model(m, A * m + B)
    assert_fallback(fit, StepModel(), "too few steps (12 < 50)")
    assert fit.n == 12
    assert_fallback(fit_step_model([], []), StepModel(), "too few steps (0 < 50)")
    custom = StepModel(a_ms_per_token=2e-4, b_ms=5.0)
    fit = fit_step_model(m, A * m + B, min_samples=100, default=custom)
    assert_fallback(fit, custom, "too few steps (12 < 100)")
    assert not fit_step_model(m, A * m + B, min_samples=10).fallback


def test_fallback_when_m_has_no_spread():
    m = np.full(200, 150_000.0)
    fit = fit_step_model(m, A * m + B + np.linspace(-1, 1, 200))
    assert_fallback(fit, StepModel(), "no spread in max KV tokens (all 150000)")


def test_fallback_on_negative_slope():
    m = loads(300)
    fit = fit_step_model(m, 80.0 - 1e-4 * m)
    assert_fallback(fit, StepModel(), "fitted a < 0 (-0.0001 ms/token)")


def test_fallback_on_negative_intercept():
    m = loads(300)
    fit = fit_step_model(m, 2e-4 * m - 3.0)
    assert_fallback(fit, StepModel(), "fitted b < 0 (-3 ms)")


def test_fallback_when_steps_take_no_time():
    m = loads(300)
    assert_fallback(fit_step_model(m, np.zeros(300)), StepModel(), "fitted model takes no time")


def test_flat_step_time_is_a_zero_slope_not_a_fallback():
    m = loads(300)
    fit = fit_step_model(m, np.full(300, 25.0))
    assert not fit.fallback
    assert fit.a_ms_per_token == pytest.approx(0.0, abs=1e-15)
    assert fit.b_ms == pytest.approx(25.0)


def test_time_span_and_non_finite_samples():
    m = loads(100)
    t = A * m + B
    ts = np.linspace(10.0, 20.0, 100)
    t[5] = np.nan
    m[7] = np.inf
    ts[0] = np.nan
    fit = fit_step_model(m, t, ts=ts)
    assert fit.n == 97
    assert (fit.t_start, fit.t_end) == (ts[1], 20.0)
    assert fit.b_ms == pytest.approx(B)
    no_ts = fit_step_model(m, t)
    assert (no_ts.t_start, no_ts.t_end) == (None, None)
    short = fit_step_model(m[:10], t[:10], ts=ts[:10])
    assert short.fallback and short.t_start == ts[1] and short.t_end == ts[9]
    with pytest.raises(ValueError):
        fit_step_model(m, t[:-1])
    with pytest.raises(ValueError):
        fit_step_model(m, t, ts=ts[:-1])


def test_a_million_steps_with_pauses():
    rng = np.random.default_rng(5)
    m = loads(1_000_000, seed=5)
    t = A * m + B + rng.normal(0.0, 1.0, m.shape[0])
    t[rng.random(m.shape[0]) < 0.05] *= 10
    fit = fit_step_model(m, t)
    assert rel(fit.a_ms_per_token, A) < 0.01 and rel(fit.b_ms, B) < 0.01
