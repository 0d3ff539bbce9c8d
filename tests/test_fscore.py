import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shadow.policies.fscore import (
    PiecewiseObjective,
    discounts,
    f_score_br0,
    f_score_brh,
    gap,
    gap_reduction,
    imbalance,
    safe_margins,
)


@pytest.mark.parametrize(
    ("added", "expected"), [(900, 900), (1000, 1000), (1100, 300), (1200, -400)]
)
def test_spec_worked_example(added, expected):
    """BALANCEROUTE.md: G = 8, margin 1000."""
    assert f_score_br0(added, 1000, 8) == expected
    assert PiecewiseObjective.br0(1000, 8).value(added) == expected


def test_gap_and_imbalance_by_hand():
    loads = np.array([10, 40, 25])
    assert gap(loads) == 3 * 40 - 75
    assert imbalance(loads) == 30
    assert safe_margins(loads).tolist() == [30, 0, 15]


@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=16),
    st.integers(0, 15),
    st.integers(0, 2 * 10**6),
)
def test_br0_f_is_exactly_the_gap_reduction(loads, worker, added):
    loads = np.array(loads)
    worker %= loads.shape[0]
    margin = loads.max() - loads[worker]
    assert f_score_br0(added, margin, loads.shape[0]) == gap_reduction(loads, worker, added)


@given(
    st.lists(st.integers(0, 20000), min_size=1, max_size=81),
    st.floats(0.5, 1.0),
    st.floats(0.0, 3.0),
    st.floats(0.0, 60.0),
    st.lists(st.integers(0, 40000), min_size=1, max_size=20),
)
def test_piecewise_objective_matches_direct_formula(margins, gamma, alpha, beta, added):
    margins = np.array(margins, dtype=float)
    d = discounts(margins.shape[0] - 1, gamma)
    objective = PiecewiseObjective(margins, d, alpha, beta)
    for value in added:
        direct = f_score_brh(value, margins, d, alpha, beta)
        assert objective.value(value) == pytest.approx(direct, rel=1e-9, abs=1e-6)
    vector = objective.values(np.array(added))
    assert np.allclose(vector, [objective.value(v) for v in added], rtol=1e-12, atol=1e-6)


@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=20),
    st.floats(0.5, 1.0),
    st.floats(0.1, 2.0),
    st.floats(0.0, 30.0),
)
def test_peak_is_the_unconstrained_maximiser(margins, gamma, alpha, beta):
    margins = np.array(margins, dtype=float)
    d = discounts(margins.shape[0] - 1, gamma)
    objective = PiecewiseObjective(margins, d, alpha, beta)
    peak = objective.peak()
    grid = np.arange(0, 12000)
    values = objective.values(grid)
    if math.isinf(peak):
        assert np.all(np.diff(values) > -1e-9)  # never stops rising
    else:
        assert objective.value(peak) >= values.max() - 1e-6 * max(1.0, abs(values.max()))


@given(
    st.floats(-1e7, 1e7, allow_nan=False),
    st.integers(1, 512),
    st.lists(st.floats(-2e7, 2e7, allow_nan=False), min_size=1, max_size=6),
)
def test_br0_objective_is_the_general_one_with_one_kink(margin, workers, added):
    """`PiecewiseObjective.br0` skips the constructor's sorting and sums: the same arrays,
    the same scores bit for bit, the same peak and rounding bound."""
    fast = PiecewiseObjective.br0(margin, workers)
    general = PiecewiseObjective(np.array([margin]), np.ones(1), 1.0, float(workers))
    for name in PiecewiseObjective.__slots__:
        assert np.array_equal(getattr(fast, name), getattr(general, name)), name
    sizes = np.array(added)
    assert fast.values(sizes).tobytes() == general.values(sizes).tobytes()
    assert [fast.value(a) for a in added] == [general.value(a) for a in added]
    assert fast.peak() == general.peak()
    assert fast.rounding_bound(1e6) == general.rounding_bound(1e6)
