"""Paired window bootstrap of a ratio of means, and a text histogram to show it.

The unit is the window, not the request: queueing metrics are autocorrelated within a
window, so resampling requests would make the interval far too narrow. A fixed seed makes
the same evidence give the same interval, hence the same verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Bound the index matrix of one chunk (rows x windows) so a long history stays in memory.
_CHUNK_CELLS = 4_000_000


@dataclass(frozen=True, eq=False)
class BootstrapResult:
    """Point ratio of means, its percentile interval, and the resampled ratios.

    `n` is the number of windows used; `dropped` those left out for a non-finite value.
    Everything is NaN (and `samples` empty) when no window is usable.
    """

    point: float
    ci_low: float
    ci_high: float
    samples: np.ndarray
    n: int = 0
    dropped: int = 0


def paired_ratio_bootstrap(
    incumbent: np.ndarray,
    candidate: np.ndarray,
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    block: int = 1,
) -> BootstrapResult:
    """Bootstrap sum(candidate) / sum(incumbent) over windows drawn with replacement.

    Windows are resampled as pairs (the same index for both arms). A window whose
    incumbent or candidate value is not finite is dropped first: a ratio of sums with a
    NaN in it says nothing. With `block` > 1 it is a moving-block bootstrap: runs of
    `block` consecutive windows are drawn (start uniform over the n - block + 1 runs)
    until n windows are drawn, so that the correlation between neighbouring windows of
    a continuous run stays inside each draw. Deterministic for the same inputs,
    `resamples`, `seed` and `block`.
    """
    inc = np.asarray(incumbent, dtype=np.float64).ravel()
    cand = np.asarray(candidate, dtype=np.float64).ravel()
    if inc.shape != cand.shape:
        raise ValueError(f"paired arrays differ in length: {inc.shape[0]} vs {cand.shape[0]}")
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    if block < 1:
        raise ValueError("block must be >= 1")
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be in (0, 1)")
    keep = np.isfinite(inc) & np.isfinite(cand)
    inc, cand = inc[keep], cand[keep]
    n, dropped = int(inc.shape[0]), int((~keep).sum())
    if n == 0:
        nan = math.nan
        return BootstrapResult(nan, nan, nan, np.empty(0), 0, dropped)
    rng = np.random.default_rng(seed)
    samples = np.empty(resamples, dtype=np.float64)
    rows = max(1, _CHUNK_CELLS // n)
    block = min(block, n)
    blocks = -(-n // block)  # draws of one block per resample, trimmed to n windows
    with np.errstate(divide="ignore", invalid="ignore"):
        for start in range(0, resamples, rows):
            stop = min(resamples, start + rows)
            if block == 1:
                idx = rng.integers(0, n, size=(stop - start, n))
            else:
                starts = rng.integers(0, n - block + 1, size=(stop - start, blocks))
                runs = starts[:, :, None] + np.arange(block)[None, None, :]
                idx = runs.reshape(stop - start, blocks * block)[:, :n]
            samples[start:stop] = np.take(cand, idx).sum(axis=1) / np.take(inc, idx).sum(axis=1)
        point = float(cand.sum() / inc.sum()) if inc.sum() != 0 else _zero_ratio(cand.sum())
    alpha = 1.0 - confidence
    if np.isnan(samples).any():
        low = high = math.nan
    else:
        low, high = (float(v) for v in np.percentile(samples, [50 * alpha, 100 - 50 * alpha]))
    return BootstrapResult(point, low, high, samples, n, dropped)


def _zero_ratio(numerator: float) -> float:
    if numerator == 0:
        return math.nan
    return math.inf if numerator > 0 else -math.inf


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
