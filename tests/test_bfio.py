"""BF-IO (`bf-io`, `bf-io-h0`): its horizon, its subset rule and its round, by hand."""

import numpy as np

from shadow.policies import ActiveSet, FleetSnapshot, ReadyPool, make_policy
from shadow.policies.bfio import (
    BF_IO_VISIBLE_PER_WORKER,
    BalanceFutureIO,
    best_subset_by_margin,
    survival_projection,
)
from shadow.policies.fscore import PiecewiseObjective
from shadow.replay import replay
from shadow.replay.workload import Workload


def test_the_horizon_keeps_survivors_at_their_length_and_drops_the_finished():
    """w0: 100 tokens with 2 steps left and 50 with 5; w1: 70 with 1 step left."""
    active = ActiveSet.from_arrays([0, 0, 1], [90, 40, 70], [10, 10, 0])
    load = np.array([150, 70])
    projection = survival_projection(load, active, np.array([2, 5, 1]), 3)
    assert projection.tolist() == [[150, 150, 50, 50], [70, 0, 0, 0]]


def test_the_subset_rule_takes_the_largest_sum_within_the_margin():
    objective = PiecewiseObjective(np.array([800.0]), np.ones(1), 1.0, 43.0)
    positions, score = best_subset_by_margin([300, 500, 450], 2, objective, 800)
    assert positions == [0, 1] and score == 800.0


def test_the_subset_rule_takes_the_smallest_sum_above_when_none_fits():
    """Margin 100: two requests sum to 800 (F = 800 - 43 * 700), one to 300 (300 - 43 *
    200): the better is the single 300, still negative (the round then admits it alone)."""
    objective = PiecewiseObjective(np.array([100.0]), np.ones(1), 1.0, 43.0)
    positions, score = best_subset_by_margin([300, 500], 2, objective, 100)
    assert positions == [0] and score == 300 - 43 * 200


def test_the_subset_rule_searches_past_the_head_of_the_pool():
    """BR-0 looks at the first R_max = 4; BF-IO at every visible one: the fit is 6th."""
    sizes = [900, 900, 900, 900, 900, 400]
    objective = PiecewiseObjective(np.array([400.0]), np.ones(1), 1.0, 43.0)
    positions, score = best_subset_by_margin(sizes, 1, objective, 400)
    assert positions == [5] and score == 400.0


def test_bf_io_h0_fills_the_low_worker_with_a_fitting_request_from_deep_in_the_pool():
    active = ActiveSet.from_arrays([0], [1000], [0], remaining=[50])
    snapshot = FleetSnapshot.from_active([2, 2], active)
    pool = ReadyPool.from_arrays(list("abcde"), [1500, 1500, 1500, 1500, 1000])
    admissions = make_policy("bf-io-h0").admit(snapshot, pool)
    assert admissions[0] == ("e", 1)  # worker 1's margin is exactly 1,000
    assert len(admissions) == 3  # work-conserving: three free slots, three admissions


def test_visible_candidates_are_capped_at_four_per_worker():
    active = ActiveSet.from_arrays([0], [1000], [0], remaining=[50])
    snapshot = FleetSnapshot.from_active([1, 1], active)
    visible = BF_IO_VISIBLE_PER_WORKER * 2
    prompts = [5000] * visible + [1000]  # the fit is one past the visible window
    pool = ReadyPool.from_arrays(list(range(len(prompts))), prompts)
    admitted = make_policy("bf-io-h0").admit(snapshot, pool)
    assert [a.request_id for a in admitted] == [0]


def test_bf_io_replays_to_completion_and_names_itself():
    rng = np.random.default_rng(3)
    workload = Workload.from_arrays(
        "small", np.cumsum(rng.exponential(0.02, 300)), rng.integers(10, 3000, 300),
        rng.integers(1, 200, 300),
    )  # fmt: skip
    for name in ("bf-io", "bf-io-h0"):
        policy = make_policy(name)
        assert isinstance(policy, BalanceFutureIO) and policy.name == name
        result = replay(workload, policy, workers=4, batch=6)
        assert (result.worker_active <= 6).all() and (result.finish_step >= 0).all()
