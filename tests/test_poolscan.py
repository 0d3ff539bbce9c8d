"""Stage 1's pool scan (shadow/policies/poolscan.py) against the full scan it replaces,
and the rounding bound its early stop rests on, against exact rational arithmetic."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow.policies.fscore import PiecewiseObjective, discounts
from shadow.policies.poolscan import SortedPool

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def objectives(draw):
    """BR-0's one-kink objective (with G = 1 it is flat past its margin: ties everywhere)
    or BR-H's discounted horizon, margins with repeats, coefficients from 0 up."""
    if draw(st.booleans()):
        margin = draw(st.floats(0, 20_000, allow_nan=False)) if draw(st.booleans()) else 0.0
        return PiecewiseObjective.br0(margin, draw(st.integers(1, 300)))
    horizon = draw(st.integers(0, 90))
    levels = draw(st.lists(st.integers(0, 50_000), min_size=1, max_size=6))
    margins = [draw(st.sampled_from(levels)) for _ in range(horizon + 1)]
    if draw(st.booleans()):  # margins that are not whole tokens
        margins = [m + draw(st.sampled_from([0.0, 0.1, 1 / 3, 0.5])) for m in margins]
    gamma = draw(st.sampled_from([1.0, 0.86, 0.5, 0.99]))
    alpha = draw(st.sampled_from([0.0, 1.0, 0.3]))
    beta = draw(st.sampled_from([0.0, 43.0, 1.0, 256.0]))
    return PiecewiseObjective(np.array(margins, dtype=np.float64), discounts(horizon, gamma),
                              alpha, beta)  # fmt: skip


@st.composite
def prompt_pools(draw):
    """Pools with many equal sizes (a small range) or spread wide (lognormal-like)."""
    high = draw(st.sampled_from([3, 60, 5_000, 40_000]))
    return np.array(draw(st.lists(st.integers(0, high), min_size=1, max_size=300)), np.int64)


def full_scan(objective: PiecewiseObjective, prompts: np.ndarray, taken: np.ndarray) -> int:
    """What Stage 1 did before the scan: score the whole pool, argmax of the untaken."""
    scores = objective.values(prompts)
    scores[taken] = -np.inf
    return int(np.argmax(scores))


@PROPERTY
@given(prompt_pools(), st.lists(objectives(), min_size=1, max_size=40))
def test_the_scan_picks_what_the_full_scan_picks_take_after_take(prompts, sequence):
    pool = SortedPool(prompts)
    taken = np.zeros(prompts.shape[0], dtype=bool)
    for objective in sequence[: prompts.shape[0]]:
        expected = full_scan(objective, prompts, taken)
        assert pool.best(objective) == expected
        pool.take(expected)
        taken[expected] = True


def test_a_flat_objective_takes_the_first_pool_position_among_equal_scores():
    """G = 1: F = D up to the margin, then flat; every prompt past it scores the margin."""
    prompts = np.array([900, 50, 5000, 1200, 5000, 700, 2000])
    objective = PiecewiseObjective.br0(1000.0, 1)
    pool = SortedPool(prompts)
    assert pool.best(objective) == 2  # 900 scores 900; 5000 (2), 1200, 5000, 2000 score 1000
    objective = PiecewiseObjective.br0(800.0, 1)
    assert pool.best(objective) == 0  # 900 (position 0) is the first that reaches 800
    pool.take(0)
    assert pool.best(objective) == 2


@pytest.mark.parametrize("margin", [0.1, 1 / 3, 0.7, 12.3])
def test_rounding_noise_on_a_flat_objective_does_not_stop_the_scan_early(margin):
    """G = 1, a margin that is not a whole token: past it `D - (D - m)` rounds to a
    handful of values around `m`, scattered over the pool. The highest of them is the
    full scan's choice, wherever it lies; a scan that stopped at the first edges scoring
    below its best (no rounding bound) misses it on every one of these pools."""
    rng = np.random.default_rng(7)
    objective = PiecewiseObjective.br0(margin, 1)
    for _ in range(50):
        prompts = rng.integers(0, 40_000, 500)
        taken = np.zeros(prompts.shape[0], dtype=bool)
        assert SortedPool(prompts).best(objective) == full_scan(objective, prompts, taken)


def test_taking_a_request_twice_is_refused():
    pool = SortedPool(np.array([5, 3, 5]))
    pool.take(2)
    with pytest.raises(ValueError, match="pool position 2 is taken already"):
        pool.take(2)
    pool.take(0)
    pool.take(1)
    with pytest.raises(ValueError, match="every request of the pool is taken"):
        pool.best(PiecewiseObjective.br0(4.0, 2))


def test_a_negative_discount_is_not_concave_and_scores_the_whole_pool():
    objective = PiecewiseObjective(np.array([10.0, 20.0]), np.array([1.0, -1.0]), 1.0, 2.0)
    assert objective.rounding_bound(100.0) == float("inf")
    prompts = np.arange(0, 60, 3)
    taken = np.zeros(prompts.shape[0], dtype=bool)
    assert SortedPool(prompts).best(objective) == full_scan(objective, prompts, taken)


def exact_f(objective: PiecewiseObjective, added: int) -> Fraction:
    """`F(D)` in rational arithmetic from the objective's own floats: its gain, `beta`,
    margins and discounts taken as exact numbers."""
    gain, beta = Fraction(objective._gain), Fraction(objective._beta)
    penalty = sum(
        (Fraction(w) * (added - Fraction(m)) for m, w in
         zip(objective._kinks.tolist(), objective._weights.tolist(), strict=True) if m < added),
        Fraction(0),
    )  # fmt: skip
    return gain * added - beta * penalty


@PROPERTY
@given(objectives(), st.lists(st.integers(0, 40_000), min_size=1, max_size=12))
def test_values_are_within_the_rounding_bound_of_the_exact_f(objective, sizes):
    bound = objective.rounding_bound(float(max(sizes)))
    rounded = objective.values(np.array(sizes, dtype=np.int64))
    for size, value in zip(sizes, rounded.tolist(), strict=True):
        assert abs(Fraction(value) - exact_f(objective, size)) <= Fraction(bound)
