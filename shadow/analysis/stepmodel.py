"""Calibrate the step model `T = a * M + b` (ms; M = max KV tokens at the barrier) from steps.

Counterfactual replays are only as good as this fit, and real step timings carry gross
outliers (GC pauses, preemption, a slow collective) that are all on one side: ordinary least
squares would let 5% of 10x-slow steps move both coefficients by tens of percent. The fit is
a Huber M-estimator solved by iteratively reweighted least squares with a MAD scale:

- Huber, not Theil-Sen: the outliers are in `T` only (M is a clean, bounded count, so
  there are no leverage points), where Huber's bounded influence suffices; it keeps 95% of
  least squares' efficiency under Gaussian noise, its loss is convex (one solution, no
  dependence on the start), and each iteration is a handful of O(n) numpy passes (dot
  products for the 2x2 normal equations): 1e6 steps fit in about 0.2 s. Theil-Sen is
  O(n^2) pairs, so large n needs a subsample of pairs, and its slope and intercept come
  from separate medians. The price: one-sided outliers still pull each coefficient by
  about `share * 1.345 * sigma` (5% pauses: ~0.07 noise sigmas), a small fraction of b.
- The scale (MAD / 0.6745 of the residuals) is re-estimated every iteration, from a fixed
  strided subsample of at most `_SCALE_SAMPLE` residuals (a median is the costliest pass and
  100k residuals pin it to well under 1%). Deterministic: no randomness anywhere.
- A physically meaningless fit (a < 0 or b < 0), too few steps, or no spread in M falls back
  to the configured default, flagged with the reason, so a replay never runs on garbage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from shadow.replay.workload import StepModel

DEFAULT_STEP_MODEL = StepModel()  # frozen: safe to share as an argument default
HUBER_K = 1.345  # 95% efficiency under Gaussian noise
MAD_TO_SIGMA = 1.0 / 0.6744897501960817
_SCALE_SAMPLE = 100_000
_MAX_ITER = 100
_TOL = 1e-8  # stop once the line moves less than this many noise sigmas


@dataclass(frozen=True)
class StepModelFit:
    """A fitted (or fallback) step model with how it was obtained.

    `r2` is the R^2 over the inliers (residual within 3 robust sigmas): how much of the
    step-time variance the line explains, without a few GC pauses hiding a good fit; NaN on
    fallback. `n` counts the finite samples used; `t_start`/`t_end` span their `ts`.
    """

    a_ms_per_token: float
    b_ms: float
    r2: float
    n: int
    t_start: float | None
    t_end: float | None
    fallback: bool
    reason: str

    def as_step_model(self) -> StepModel:
        return StepModel(a_ms_per_token=self.a_ms_per_token, b_ms=self.b_ms)


def _huber_irls(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Huber regression of y on x (x already centred): (slope, intercept, residual scale)."""
    n = x.shape[0]
    stride = max(1, n // _SCALE_SAMPLE)
    sxx = float(x @ x)
    slope = float(x @ y) / sxx  # OLS start (x is centred, so the intercept is the mean)
    intercept = float(y.mean())
    y_scale = float(np.abs(y).max()) or 1.0
    span = float(np.abs(x).max())
    scale = 0.0
    for _ in range(_MAX_ITER):
        resid = y - (slope * x + intercept)
        abs_resid = np.abs(resid, out=resid)
        scale = float(np.median(abs_resid[::stride])) * MAD_TO_SIGMA
        if scale <= 1e-12 * y_scale:
            # Over half the points sit exactly on the line: fit that line, ignore the rest.
            if not abs_resid.any():
                break
            scale = 1e-12 * y_scale
        cut = HUBER_K * scale
        # w = 1 inside the cut, cut / |r| outside (division guarded by the maximum).
        weights = cut / np.maximum(abs_resid, cut)
        sw = float(weights.sum())
        wx = weights * x
        swx = float(wx.sum())
        swy = float(weights @ y)
        swxx = float(wx @ x)
        swxy = float(wx @ y)
        det = sw * swxx - swx * swx
        if det <= 0:
            break
        new_slope = (sw * swxy - swx * swy) / det
        new_intercept = (swy - new_slope * swx) / sw
        moved = abs(new_slope - slope) * span + abs(new_intercept - intercept)
        slope, intercept = new_slope, new_intercept
        if moved <= _TOL * max(scale, 1e-6 * y_scale):
            break
    return slope, intercept, scale


def _inlier_r2(x: np.ndarray, y: np.ndarray, slope: float, c: float, scale: float) -> float:
    """R^2 over the samples within 3 robust sigmas of the line (GC pauses left out)."""
    resid = y - (slope * x + c)
    inside = np.abs(resid) <= 3.0 * scale
    if int(inside.sum()) < 2:
        return math.nan
    kept = y[inside]
    dev = kept - kept.mean()
    ss_tot = float(dev @ dev)
    ss_res = float(resid[inside] @ resid[inside])
    if ss_tot <= 0:
        return 1.0 if ss_res <= 0 else math.nan
    return 1.0 - ss_res / ss_tot


def fit_step_model(
    max_kv_tokens: ArrayLike,
    duration_ms: ArrayLike,
    *,
    ts: ArrayLike | None = None,
    min_samples: int = 50,
    default: StepModel = DEFAULT_STEP_MODEL,
) -> StepModelFit:
    """Fit `duration_ms = a * max_kv_tokens + b` robustly, or fall back to `default`.

    Samples with a non-finite M, T (or ts) are dropped first. Falls back (flagged, r2 NaN)
    when fewer than `min_samples` remain, when M has no spread, or when a < 0 or b < 0.
    """
    m = np.asarray(max_kv_tokens, dtype=np.float64).ravel()
    t = np.asarray(duration_ms, dtype=np.float64).ravel()
    if m.shape != t.shape:
        raise ValueError(f"max_kv_tokens and duration_ms differ in length ({m.size} != {t.size})")
    stamps = None if ts is None else np.asarray(ts, dtype=np.float64).ravel()
    if stamps is not None and stamps.shape != m.shape:
        raise ValueError(f"ts and duration_ms differ in length ({stamps.size} != {t.size})")
    keep = np.isfinite(m) & np.isfinite(t)
    if stamps is not None:
        keep &= np.isfinite(stamps)
    if not keep.all():
        m, t = m[keep], t[keep]
        stamps = None if stamps is None else stamps[keep]
    n = int(m.shape[0])
    t_start = float(stamps.min()) if stamps is not None and n else None
    t_end = float(stamps.max()) if stamps is not None and n else None

    def fallback(reason: str) -> StepModelFit:
        return StepModelFit(
            default.a_ms_per_token, default.b_ms, math.nan, n, t_start, t_end, True, reason
        )

    if n < min_samples or n < 2:
        return fallback(f"too few steps ({n} < {max(min_samples, 2)})")
    lo, hi = float(m.min()), float(m.max())
    if hi == lo:
        return fallback(f"no spread in max KV tokens (all {lo:g})")
    centre = float(m.mean())
    x = m - centre
    slope, intercept_c, scale = _huber_irls(x, t)
    if -1e-12 * float(np.abs(t).max()) <= slope * (hi - lo) < 0:
        slope = 0.0  # a flat T with rounding noise, not a falling one
    intercept = intercept_c - slope * centre
    if slope < 0:
        return fallback(f"fitted a < 0 ({slope:.3g} ms/token): step time falls with KV tokens")
    if intercept < 0:
        return fallback(f"fitted b < 0 ({intercept:.3g} ms): no fixed cost per step")
    if slope == 0 and intercept <= 0:
        return fallback("fitted model takes no time (a = 0, b = 0)")
    r2 = _inlier_r2(x, t, slope, intercept_c, scale)
    return StepModelFit(slope, intercept, r2, n, t_start, t_end, False, "fit")
