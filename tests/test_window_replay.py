"""A window's replay on the fleet as it was: per-worker slots (a draining worker takes
nothing, uneven B holds), and an A/A run that moves even for a deterministic incumbent."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shadow.policies import BalanceRouteConfig, make_policy
from shadow.replay import InitialRequest, replay
from shadow.replay.workload import StepModel
from shadow.stream.windows import AA, WINDOW_METRICS, WindowSpec, evaluate_window
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime

WORKERS, BATCH = 4, 16
MODEL = StepModel()


def _arrivals(n: int = 400, load: float = 0.9):
    workload = generate("paper-azure2024", seed=3, n=n)
    return retime(workload, load=load, workers=WORKERS, batch=BATCH, step_model=MODEL)


def _spec(policies, incumbent, capacity=None, initial=()):
    arrivals = _arrivals()
    return WindowSpec(
        fleet="f", index=4, t_start=0.0, t_end=float(arrivals.ready_s[-1]), workers=WORKERS,
        batch=BATCH, step_model=MODEL, policies=tuple(policies), incumbent=incumbent,
        balance_route=BalanceRouteConfig(), initial=tuple(initial), arrivals=arrivals,
        observed=dict.fromkeys(WINDOW_METRICS, math.nan), history=np.empty(0, dtype=np.int64),
        imputed=0, capacity=capacity,
    )  # fmt: skip


def test_a_draining_worker_decodes_what_it_holds_and_takes_nothing():
    held = InitialRequest(worker=0, prompt_tokens=2000, generated=10, remaining=300)
    result = replay(
        _arrivals(), make_policy("jsq"), workers=WORKERS, batch=BATCH, step_model=MODEL,
        initial=[held], capacity=[0, BATCH, 8, BATCH],
    )  # fmt: skip
    trace = ~result.from_initial
    assert not (result.worker[trace] == 0).any()  # nothing new on the draining worker
    assert result.worker_active[:, 0].max() == 1  # it still decodes the one it held
    assert result.finish_step[result.from_initial][0] == 299  # to its end
    assert result.worker_active[:, 2].max() == 8  # its own B, not the largest
    assert result.worker_active[:, [1, 3]].max() == BATCH


def test_capacity_is_checked():
    with pytest.raises(ValueError, match="capacity needs 4 values"):
        replay(_arrivals(10), make_policy("jsq"), workers=4, batch=8, capacity=[8, 8])
    with pytest.raises(ValueError, match="no worker takes requests"):
        replay(_arrivals(10), make_policy("jsq"), workers=4, batch=8, capacity=[0, 0, 0, 0])


def test_a_window_replays_its_draining_worker_without_new_work():
    result = evaluate_window(_spec(["jsq"], "jsq", capacity=(BATCH, 0, BATCH, BATCH)))
    assert result.trajectories["jsq"].loads[:, 1].max() == 0


@pytest.mark.parametrize("incumbent", ["rr", "jsq"])
def test_a_deterministic_incumbent_has_an_aa_noise_floor(incumbent):
    """`rr` has no random draws: the A/A run relabels the fleet's workers, so its start
    and its order fall elsewhere (and JSQ's ties are drawn at random besides). BR-0, with
    no ties to draw, replays the same: the gate's noise row says so."""
    started = [InitialRequest(g, 3000 + 500 * g, 40 * g, 200 + 300 * g) for g in (0, 0, 1, 2)]
    metrics = evaluate_window(_spec([incumbent], incumbent, initial=started)).metrics
    same, other = metrics[incumbent], metrics[AA]
    assert same["steps"] > 0 and other["steps"] > 0
    assert any(same[k] != other[k] for k in ("imbalance_mean", "tpot_p95_ms", "gap_mean"))
    # the floor is noise, not another policy: within a few percent of the incumbent
    assert other["throughput_tok_s"] == pytest.approx(same["throughput_tok_s"], rel=0.05)
