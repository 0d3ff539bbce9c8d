"""Paired window bootstraps of the gate's ratios, and a text histogram to show them.

The unit is the window, not the request: queueing metrics are autocorrelated within a
window, so resampling requests would make the interval far too narrow. A fixed seed makes
the same evidence give the same interval, hence the same verdict.

Each arm's statistic is the quantity the truth (a full replay's `summarize`) measures,
computed over the windows drawn: a weighted mean (throughput: tokens over the run's busy
time, each window weighted by its busy seconds; imbalance: the mean over steps, each
window weighted by its steps), or a percentile of the per-request values pooled across
the windows drawn (TPOT P95: the P95 over requests, not a mean of window P95s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# Bound the index matrix of one chunk (rows x windows) so a long history stays in memory.
_CHUNK_CELLS = 4_000_000


@dataclass(frozen=True, eq=False)
class BootstrapResult:
    """Point ratio, its percentile interval, and the resampled ratios.

    `n` is the number of windows used; `dropped` those left out for a non-finite value.
    Everything is NaN (and `samples` empty) when no window is usable.
    """

    point: float
    ci_low: float
    ci_high: float
    samples: np.ndarray
    n: int = 0
    dropped: int = 0


def _check(resamples: int, confidence: float, block: int) -> None:
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    if block < 1:
        raise ValueError("block must be >= 1")
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be in (0, 1)")


def _draws(resamples: int, n: int, block: int, seed: int, per_row: int):
    """Chunks of window indices, (rows, n) each: `n` windows drawn with replacement, as
    runs of `block` consecutive windows (start uniform over the n - block + 1 runs) when
    `block` > 1, so that the correlation between neighbouring windows of a continuous run
    stays inside each draw. `per_row` bounds the cells of a chunk's own work."""
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_CELLS // max(1, per_row))
    block = min(block, n)
    blocks = -(-n // block)  # draws of one block per resample, trimmed to n windows
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        if block == 1:
            yield start, stop, rng.integers(0, n, size=(stop - start, n))
        else:
            starts = rng.integers(0, n - block + 1, size=(stop - start, blocks))
            runs = starts[:, :, None] + np.arange(block)[None, None, :]
            yield start, stop, runs.reshape(stop - start, blocks * block)[:, :n]


def _interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    if np.isnan(samples).any():
        return math.nan, math.nan
    alpha = 1.0 - confidence
    low, high = np.percentile(samples, [50 * alpha, 100 - 50 * alpha])
    return float(low), float(high)


def paired_ratio_bootstrap(
    incumbent: np.ndarray,
    candidate: np.ndarray,
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    block: int = 1,
    incumbent_weight: np.ndarray | None = None,
    candidate_weight: np.ndarray | None = None,
) -> BootstrapResult:
    """Bootstrap the ratio of the arms' weighted means over windows drawn with replacement.

    Each arm's statistic is sum(value x weight) / sum(weight) over the windows drawn; with
    no weights it is the ratio of sums, sum(candidate) / sum(incumbent). Windows are
    resampled as pairs (the same index for both arms). A window with weight 0 adds
    nothing (its value may be NaN: a run with nothing to do has no throughput); one
    whose value or weight is otherwise not finite is dropped first. With `block` > 1 it
    is a moving-block bootstrap (`_draws`). Deterministic for the same inputs,
    `resamples`, `seed` and `block`.
    """
    inc = np.asarray(incumbent, dtype=np.float64).ravel()
    cand = np.asarray(candidate, dtype=np.float64).ravel()
    if inc.shape != cand.shape:
        raise ValueError(f"paired arrays differ in length: {inc.shape[0]} vs {cand.shape[0]}")
    _check(resamples, confidence, block)
    weighted = incumbent_weight is not None or candidate_weight is not None
    w_inc = _weights(incumbent_weight, inc.shape, "incumbent_weight")
    w_cand = _weights(candidate_weight, cand.shape, "candidate_weight")
    with np.errstate(invalid="ignore"):
        x_inc = np.where(w_inc == 0, 0.0, inc * w_inc)
        x_cand = np.where(w_cand == 0, 0.0, cand * w_cand)
    keep = np.isfinite(x_inc) & np.isfinite(x_cand) & np.isfinite(w_inc) & np.isfinite(w_cand)
    x_inc, x_cand, w_inc, w_cand = x_inc[keep], x_cand[keep], w_inc[keep], w_cand[keep]
    n, dropped = int(x_inc.shape[0]), int((~keep).sum())
    if n == 0:
        nan = math.nan
        return BootstrapResult(nan, nan, nan, np.empty(0), 0, dropped)
    samples = np.empty(resamples, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for start, stop, idx in _draws(resamples, n, block, seed, n):
            ratio = np.take(x_cand, idx).sum(axis=1) / np.take(x_inc, idx).sum(axis=1)
            if weighted:
                ratio *= np.take(w_inc, idx).sum(axis=1) / np.take(w_cand, idx).sum(axis=1)
            samples[start:stop] = ratio
        if x_inc.sum() == 0:
            point = _zero_ratio(x_cand.sum())
        else:
            point = float(x_cand.sum() / x_inc.sum())
            if weighted:
                point *= float(w_inc.sum() / w_cand.sum())
    low, high = _interval(samples, confidence)
    return BootstrapResult(point, low, high, samples, n, dropped)


def _weights(weight: np.ndarray | None, shape: tuple[int, ...], name: str) -> np.ndarray:
    if weight is None:
        return np.ones(shape)
    w = np.asarray(weight, dtype=np.float64).ravel()
    if w.shape != shape:
        raise ValueError(f"{name} has {w.shape[0]} windows, the values {shape[0]}")
    if (w < 0).any():
        raise ValueError(f"{name} must be >= 0 in every window")
    return w


def paired_percentile_bootstrap(
    incumbent: Sequence[np.ndarray | None],
    candidate: Sequence[np.ndarray | None],
    *,
    q: float = 95.0,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    block: int = 1,
) -> BootstrapResult:
    """Bootstrap the ratio of pooled percentiles: per window, each arm's per-request
    values (TPOTs); each arm's statistic is the `q`th percentile of the values of the
    windows drawn, pooled (a window drawn twice counts twice), as `np.percentile` of
    that multiset. A window with an arm not measured (None) is dropped; one with no
    values adds none. Windows are drawn as `paired_ratio_bootstrap` draws them."""
    if len(incumbent) != len(candidate):
        raise ValueError(f"paired arrays differ in length: {len(incumbent)} vs {len(candidate)}")
    _check(resamples, confidence, block)
    if not 0.0 <= q <= 100.0:
        raise ValueError("q must be in [0, 100]")
    both = [
        (np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel())
        for a, b in zip(incumbent, candidate, strict=True)
        if a is not None and b is not None
    ]
    inc, cand = [a for a, _ in both], [b for _, b in both]
    n, dropped = len(both), len(incumbent) - len(both)
    arms = [_Pooled(values) for values in (inc, cand)]
    if n == 0 or not all(arm.values.size for arm in arms):
        nan = math.nan
        return BootstrapResult(nan, nan, nan, np.empty(0), n, dropped)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(np.percentile(arms[1].values, q) / np.percentile(arms[0].values, q))
        samples = np.empty(resamples, dtype=np.float64)
        # a resample's cells: its window counts, checkpoint counts and one segment
        size = n + max(arm.segment + arm.ends.shape[0] for arm in arms)
        for start, stop, idx in _draws(resamples, n, block, seed, size):
            rows = stop - start
            flat = (np.arange(rows)[:, None] * n + idx).ravel()
            counts = np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.int32)
            samples[start:stop] = arms[1].percentile(counts, q) / arms[0].percentile(counts, q)
    low, high = _interval(samples, confidence)
    return BootstrapResult(point, low, high, samples, n, dropped)


class _Pooled:
    """One arm's per-request values of every window, sorted once, each with its window.

    A resample's percentile is the value at a rank of the multiset its draws pool. The
    rank is found in two steps so a resample costs O(windows x checkpoints + segment), not
    O(requests): the pooled values are cut into segments of `segment` values, each
    checkpoint (a segment's end) knows how many values of each window lie before it, so
    one matrix product gives every resample's cumulative count at every checkpoint; only
    the segment holding the rank is then counted value by value. Exact: the same value
    as `np.percentile` of the multiset (tests/test_gate_statistics.py). Segments of
    sqrt(windows x values) / 16 measured fastest (the product runs in BLAS, the count
    does not): a day of 2,880 windows x 300 requests, 1,000 resamples, ten arms, 2 s
    where counting every value took 118 s.
    """

    def __init__(self, per_window: list[np.ndarray]) -> None:
        values = np.concatenate(per_window) if per_window else np.empty(0)
        label = np.repeat(np.arange(len(per_window)), [v.size for v in per_window])
        order = np.argsort(values)  # ties: any order, the same value at every rank
        self.values, self.label = values[order], label[order]
        finite = np.isfinite(self.values)
        self.values, self.label = self.values[finite], self.label[finite]
        windows, size = len(per_window), self.values.shape[0]
        # a resample costs windows x checkpoints (size / segment) in BLAS + segment counted
        self.segment = min(max(1, size), max(1, math.isqrt(windows * size) // 16))
        ends = np.arange(self.segment, size, self.segment)  # checkpoint k: values < ends[k]
        # before[w, k]: how many of window w's values the first ends[k] pooled ones hold
        first_after = np.searchsorted(ends, np.arange(size), side="right")
        keep = first_after < ends.shape[0]
        cells = self.label[keep] * ends.shape[0] + first_after[keep]
        before = np.bincount(cells, minlength=windows * ends.shape[0]).astype(np.float64)
        before = np.cumsum(before.reshape(windows, ends.shape[0]), axis=1)
        self.ends, self.before = ends, before

    def percentile(self, counts: np.ndarray, q: float) -> np.ndarray:
        """Per row of `counts` (how often each window was drawn), the linear-interpolated
        percentile of the multiset those draws pool, as `np.percentile` computes it."""
        total = counts @ np.bincount(self.label, minlength=counts.shape[1]).astype(np.int64)
        h = (total - 1) * (q / 100.0)
        below = np.floor(h)
        frac = h - below
        at_checkpoint = counts.astype(np.float64) @ self.before  # (rows, checkpoints)
        low = self._value_at(counts, at_checkpoint, below)
        high = self._value_at(counts, at_checkpoint, np.minimum(below + 1, total - 1))
        out = low + frac * (high - low)
        return np.where(total > 0, out, np.nan)

    def _value_at(self, counts: np.ndarray, at_checkpoint: np.ndarray, rank: np.ndarray):
        """Per row, the value at 0-based `rank` of its multiset: the first pooled value
        whose cumulative count exceeds the rank."""
        rows, size = counts.shape[0], self.values.shape[0]
        # the segment holding it: after the checkpoints whose cumulative count is <= rank
        segment = (at_checkpoint <= rank[:, None]).sum(axis=1)
        start, offset = np.zeros(rows, dtype=np.int64), np.zeros(rows)
        passed = segment > 0
        if passed.any():
            start[passed] = self.ends[segment[passed] - 1]
            offset[passed] = at_checkpoint[np.flatnonzero(passed), segment[passed] - 1]
        positions = start[:, None] + np.arange(self.segment)[None, :]
        inside = positions < size
        labels = self.label[np.minimum(positions, size - 1)]
        weights = np.where(inside, np.take_along_axis(counts, labels, axis=1), 0)
        cum = offset[:, None] + np.cumsum(weights, axis=1)
        index = start + (cum <= rank[:, None]).sum(axis=1)
        return self.values[np.minimum(index, size - 1)]


def _zero_ratio(numerator: float) -> float:
    if numerator == 0:
        return math.nan
    return math.inf if numerator > 0 else -math.inf


#: the window metric that weighs each window's value in the arm's mean (GATE.md): the
#: run's busy seconds for throughput (tokens over busy time, as a replay's tokens over its
#: makespan), its steps for imbalance (the mean over steps)
WEIGHTS = {"throughput_tok_s": "busy_s", "imbalance_mean": "steps"}


def estimate_ratio(
    key: str,
    incumbent: Mapping[str, np.ndarray],
    other: Mapping[str, np.ndarray],
    incumbent_tpot: Sequence[Sequence[float] | np.ndarray | None] = (),
    other_tpot: Sequence[Sequence[float] | np.ndarray | None] = (),
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    block: int = 1,
) -> BootstrapResult:
    """The other / incumbent ratio of window metric `key` as the truth measures it
    (GATE.md), the one estimate the gate and the UI's table both give: TPOT P95 over the
    per-request TPOTs of the windows pooled, throughput and imbalance weighted means
    (`WEIGHTS`). `incumbent`/`other`: per-window arrays of each arm's metrics, paired by
    position. A window without what that needs (per-request TPOTs, busy seconds: stored
    before they were) is left out; evidence with none of it falls back to the ratio of
    window sums."""
    inc, cand = incumbent[key], other[key]
    common = dict(resamples=resamples, confidence=confidence, seed=seed, block=block)
    if key == "tpot_p95_ms":
        pairs = zip(incumbent_tpot, other_tpot, strict=True)
        if any(x is not None and y is not None for x, y in pairs):
            return paired_percentile_bootstrap(incumbent_tpot, other_tpot, q=95.0, **common)
    weight = WEIGHTS.get(key)
    if weight is not None:
        w_inc, w_other = incumbent[weight], other[weight]
        if np.isfinite(w_inc).any() and np.isfinite(w_other).any():
            return paired_ratio_bootstrap(
                inc, cand, incumbent_weight=w_inc, candidate_weight=w_other, **common
            )
    return paired_ratio_bootstrap(inc, cand, **common)


def histogram_text(samples: np.ndarray, bins: int = 20, width: int = 40) -> str:
    """ASCII histogram of bootstrap samples, one line per bin: edges, bar, count."""
    values = np.asarray(samples, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return "(no finite samples)"
    counts, edges = np.histogram(finite, bins=max(1, int(bins)))
    top = int(counts.max())
    lines = []
    for i, count in enumerate(counts):
        bar = "#" * (round(width * int(count) / top) if top else 0)
        close = "]" if i == len(counts) - 1 else ")"
        lines.append(f"[{edges[i]:.4f}, {edges[i + 1]:.4f}{close} {bar:<{width}} {int(count)}")
    skipped = values.size - finite.size
    if skipped:
        lines.append(f"({skipped} non-finite samples not shown)")
    return "\n".join(lines)
