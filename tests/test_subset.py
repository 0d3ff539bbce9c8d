import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.policies.fscore import PiecewiseObjective, discounts
from shadow.policies.subset import (
    SubsetChoice,
    _best_by_sums,
    _recover,
    best_reachable_sum,
    best_single,
    best_subset,
    reachable_layers,
    reachable_sums,
)

objectives = st.builds(
    lambda margins, gamma, alpha, beta: PiecewiseObjective(
        np.array(margins, dtype=float), discounts(len(margins) - 1, gamma), alpha, beta
    ),
    st.lists(st.integers(0, 30000), min_size=1, max_size=12),
    st.floats(0.5, 1.0),
    st.floats(0.2, 2.0),
    st.floats(0.0, 50.0),
)


@settings(max_examples=300, deadline=None)
@given(objectives, st.lists(st.integers(0, 9000), min_size=1, max_size=10), st.integers(1, 12))
def test_subset_search_equals_brute_force(objective, sizes, max_items):
    choice = best_subset(objective, sizes, max_items)
    brute = max(
        objective.value(sum(sizes[i] for i in subset))
        for k in range(1, min(max_items, len(sizes)) + 1)
        for subset in itertools.combinations(range(len(sizes)), k)
    )
    # Equal up to rounding: on a plateau (slope exactly 0) sums tie mathematically.
    assert choice.score == pytest.approx(brute, rel=1e-12, abs=1e-9)
    assert 1 <= len(choice.positions) <= max_items
    assert len(set(choice.positions)) == len(choice.positions)
    assert sum(sizes[i] for i in choice.positions) == choice.added
    assert objective.value(choice.added) == choice.score


@settings(max_examples=300, deadline=None)
@given(objectives, st.lists(st.integers(0, 9000), min_size=1, max_size=10), st.integers(1, 10))
def test_concavity_search_equals_every_reachable_sum(objective, sizes, max_items):
    bits = reachable_sums(sizes, max_items)
    every = [d for d in range(bits.bit_length()) if (bits >> d) & 1]
    added, score = best_reachable_sum(objective, bits)
    assert score == pytest.approx(max(objective.value(d) for d in every), rel=1e-12, abs=1e-9)
    assert (bits >> added) & 1


def test_reachable_sums_respect_the_item_limit():
    bits = reachable_sums([1, 2, 4], 2)
    assert [d for d in range(8) if (bits >> d) & 1] == [1, 2, 3, 4, 5, 6]


def test_ties_prefer_older_requests():
    objective = PiecewiseObjective.br0(1000, 8)
    assert best_subset(objective, [500, 500, 500], 1).positions == (0,)


def test_sixteen_candidates_against_brute_force():
    rng = np.random.default_rng(0)
    objective = PiecewiseObjective(
        rng.integers(0, 40000, 81).astype(float), discounts(80, 0.86), 1.0, 43.0
    )
    sizes = rng.integers(1, 20000, 16).tolist()
    choice = best_subset(objective, sizes, 16)
    sums = np.zeros(1, dtype=np.int64)
    for size in sizes:  # every subset sum, vectorised
        sums = np.concatenate((sums, sums + size))
    assert choice.score == pytest.approx(objective.values(sums[1:]).max(), rel=1e-12)


@settings(max_examples=500, deadline=None)
@given(objectives, st.lists(st.integers(0, 9000), min_size=1, max_size=8))
def test_one_free_slot_chooses_as_the_bitset_search(objective, sizes):
    """`best_subset`'s one-slot path is the bitset search's choice exactly (sum, score and
    the earliest request of that size), not only an equally good one."""
    layers = reachable_layers(sizes, 1)
    bits = layers[-1][1]
    added, score = best_reachable_sum(objective, bits)
    expected = SubsetChoice(_recover(layers, sizes, added), added, score)
    assert best_single(objective, sizes) == expected
    assert best_subset(objective, sizes, 1) == expected


def test_one_free_slot_takes_the_earliest_of_equal_sizes_past_the_peak():
    # peak at 100: the nearest size above it, 700, is held twice
    objective = PiecewiseObjective.br0(100, 8)
    assert best_subset(objective, [900, 700, 700, 800], 1).positions == (1,)


@pytest.mark.parametrize(
    ("margin", "sizes"),
    [(math.nan, [100, 200]), (-math.inf, [100, 200]), (500.0, [100, -3])],
    ids=["nan-peak", "minus-inf-peak", "negative-size"],
)
def test_one_free_slot_fails_where_the_bitset_search_fails(margin, sizes):
    """Inputs no policy makes still raise, as they did: a guarded policy's error is
    counted and answered by the fallback, never turned into a routing choice."""
    objective = PiecewiseObjective.br0(margin, 8)
    with pytest.raises(Exception) as search:
        _best_by_sums(objective, sizes, 1)
    with pytest.raises(search.type):
        best_subset(objective, sizes, 1)
