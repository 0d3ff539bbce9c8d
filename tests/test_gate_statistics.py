"""The pooled-percentile bootstrap's fast rank search against the definition: each
resample's percentile is `np.percentile` of the multiset its drawn windows pool."""

from __future__ import annotations

import numpy as np
import pytest

from shadow.gate.statistics import paired_percentile_bootstrap


@pytest.mark.parametrize("q", [0.0, 50.0, 95.0, 99.0, 100.0])
@pytest.mark.parametrize("ties", [False, True])
def test_pooled_percentile_equals_np_percentile_of_the_drawn_multiset(q, ties):
    rng = np.random.default_rng(int(q) + ties)
    windows = 60
    # windows of unequal sizes, some empty, ties across windows when `ties`
    sizes = rng.integers(0, 40, windows)
    per_window = [
        rng.choice([10.0, 20.0, 30.0, 50.0], s) if ties else rng.lognormal(3.0, 0.5, s)
        for s in sizes
    ]
    other = [v * rng.uniform(0.9, 1.1) for v in per_window]
    got = paired_percentile_bootstrap(per_window, other, q=q, resamples=50, seed=3)
    # the same draws, the definition: percentile of the pooled multiset of each resample
    draws = np.random.default_rng(3).integers(0, windows, size=(50, windows))
    want = [
        np.percentile(np.concatenate([other[i] for i in row]), q)
        / np.percentile(np.concatenate([per_window[i] for i in row]), q)
        for row in draws
    ]
    assert got.samples == pytest.approx(np.array(want), rel=1e-12)
    assert got.point == pytest.approx(
        np.percentile(np.concatenate(other), q) / np.percentile(np.concatenate(per_window), q),
        rel=1e-12,
    )
