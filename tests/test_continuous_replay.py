"""A run fed its arrivals a window at a time (a continuous counterfactual) steps exactly as
the replay of the whole workload at once: same steps, loads, admissions and finishes, for
pool and worker-queue policies, deciding by round or on arrival, from an observed start."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.policies import make_policy
from shadow.replay import InitialRequest, replay
from shadow.replay.engine import FleetReplay
from shadow.replay.workload import StepModel, Workload

MODEL = StepModel(a_ms_per_token=0.01, b_ms=5.0)
POLICIES = ("jsq", "jsq-pool", "rr", "random", "br0", "brh-survival", "vllm-dplb")


def workload(seed: int, n: int, rate_per_s: float) -> Workload:
    rng = np.random.default_rng(seed)
    ready = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    return Workload.from_arrays("w", ready, rng.integers(1, 3000, n), rng.integers(1, 400, n))


def fed_in_windows(
    work: Workload,
    name: str,
    cuts: list[float],
    *,
    decide_on_arrival: bool,
    initial=(),
    capacity=None,
) -> FleetReplay:
    run = FleetReplay(
        make_policy(name), workers=4, batch=6, step_model=MODEL, initial=initial,
        decide_on_arrival=decide_on_arrival, capacity=capacity,
    )  # fmt: skip
    ready_ms = work.ready_s * 1000.0
    added = 0
    for until in [*cuts, math.inf]:
        upto = int(np.searchsorted(ready_ms, until, side="right"))
        run.add_requests(
            ready_ms[added:upto], work.prompt_tokens[added:upto],
            work.output_tokens[added:upto], work.prompt_keys[added:upto],
        )  # fmt: skip
        added = upto
        run.advance(until)
        run_steps.append(run.take_steps())
    return run


run_steps: list = []


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    name=st.sampled_from(POLICIES),
    window_ms=st.floats(3.0, 4000.0),
    decide_on_arrival=st.booleans(),
    with_initial=st.booleans(),
    uneven=st.booleans(),
)
def test_feeding_a_window_at_a_time_is_the_whole_replay(
    seed, name, window_ms, decide_on_arrival, with_initial, uneven
):
    capacity = (6, 3, 0, 5) if uneven else None  # a draining worker, uneven B
    work = workload(seed, 120, rate_per_s=40.0)
    initial = (
        [InitialRequest(g % 4, 100 + g, g, 5 + 7 * g) for g in range(7)] if with_initial else []
    )
    whole = replay(
        work, make_policy(name), workers=4, batch=6, step_model=MODEL, initial=initial,
        decide_on_arrival=decide_on_arrival, capacity=capacity,
    )  # fmt: skip
    span = float(work.ready_s[-1] * 1000.0)
    cuts = list(np.arange(window_ms, span, window_ms))
    run_steps.clear()
    run = fed_in_windows(
        work, name, cuts, decide_on_arrival=decide_on_arrival, initial=initial, capacity=capacity
    )
    starts = np.concatenate([b.start_ms for b in run_steps])
    loads = np.concatenate([b.worker_load for b in run_steps])
    active = np.concatenate([b.worker_active for b in run_steps])
    assert [b.first_step for b in run_steps] == list(
        np.cumsum([0] + [b.steps for b in run_steps])[:-1]
    )
    np.testing.assert_array_equal(starts, whole.step_start_ms)
    np.testing.assert_array_equal(loads, whole.worker_load)
    np.testing.assert_array_equal(active, whole.worker_active)
    view = run.requests_view()
    m = len(initial)
    for field in ("admit_step", "finish_step", "worker"):
        np.testing.assert_array_equal(
            np.concatenate((view[field][m:], view[field][:m])), getattr(whole, field)
        )


def test_a_run_pauses_where_an_unknown_arrival_could_change_it():
    """With a free slot and no arrival known past the frontier, the run stops at the
    frontier's step boundary instead of stepping into time it cannot know."""
    run = FleetReplay(make_policy("jsq"), workers=2, batch=2, step_model=MODEL)
    run.add_requests(np.array([0.0]), np.array([10]), np.array([1000]))
    run.advance(100.0)
    block = run.take_steps()
    assert block.steps and block.start_ms[-1] <= 100.0
    assert run.now <= 100.0 + MODEL.b_ms + 1  # not the request's whole life
    run.add_requests(np.array([150.0]), np.array([10]), np.array([3]))
    run.advance(math.inf)
    assert run.requests_view()["admit_ms"][1] >= 150.0
    assert run.requests_view()["worker"].tolist() == [0, 1]


def test_arrivals_out_of_ready_order_are_refused():
    run = FleetReplay(make_policy("jsq"), workers=2, batch=2)
    run.add_requests(np.array([5.0]), np.array([1]), np.array([1]))
    try:
        run.add_requests(np.array([4.0]), np.array([1]), np.array([1]))
    except ValueError as error:
        assert "ready order" in str(error)
    else:
        raise AssertionError("an earlier arrival was accepted")


@pytest.mark.parametrize("name", ["jsq", "jsq-pool", "br0", "brh-survival"])
@pytest.mark.parametrize("decide_on_arrival", [False, True])
def test_a_run_that_drops_finished_requests_steps_as_the_whole_replay(name, decide_on_arrival):
    """A long run fed window by window that drops what finished after each window holds
    only the requests still in flight, and its steps and every request's admission and
    finish are the whole replay's."""
    work = workload(11, 900, rate_per_s=0.8)
    initial = [InitialRequest(g % 4, 100 + g, g, 5 + 7 * g) for g in range(7)]
    whole = replay(
        work, make_policy(name), workers=4, batch=6, step_model=MODEL, initial=initial,
        decide_on_arrival=decide_on_arrival,
    )  # fmt: skip
    m, n = len(initial), len(work)
    # the whole replay's requests in the run's order (initial ones first)
    truth_finish = np.concatenate((whole.finish_step[n:], whole.finish_step[:n]))
    truth_worker = np.concatenate((whole.worker[n:], whole.worker[:n]))
    run = FleetReplay(
        make_policy(name), workers=4, batch=6, step_model=MODEL, initial=initial,
        decide_on_arrival=decide_on_arrival,
    )  # fmt: skip
    ids = np.arange(m)  # the whole replay's index (run order) of each request the run holds
    seen = {field: np.full(m + n, -2, dtype=np.int64) for field in ("finish_step", "worker")}
    ready_ms = work.ready_s * 1000.0
    added, blocks, held = 0, [], []
    for until in [*np.arange(5000.0, float(ready_ms[-1]), 5000.0), math.inf]:
        upto = int(np.searchsorted(ready_ms, until, side="right"))
        run.add_requests(
            ready_ms[added:upto], work.prompt_tokens[added:upto],
            work.output_tokens[added:upto], work.prompt_keys[added:upto],
        )  # fmt: skip
        ids = np.concatenate((ids, m + np.arange(added, upto)))
        added = upto
        run.advance(until)
        blocks.append(run.take_steps())
        view = run.requests_view()
        for field, values in seen.items():
            values[ids] = view[field]
        keep = run.drop_finished(run.step)
        ids = ids[keep]
        # the requests that have not finished before the run's step are held, and besides
        # them only those whose last step is the run's last (a run paused at the frontier
        # has taken that step, not yet its completions)
        unfinished = (truth_finish[: m + added] >= run.step) | (truth_worker[: m + added] < 0)
        assert set(np.flatnonzero(unfinished)) <= set(ids.tolist())
        assert (truth_finish[ids[~unfinished[ids]]] == run.step - 1).all()
        held.append(run.requests)
    assert run.dropped + run.requests == m + n
    assert max(held) < (m + n) / 5
    np.testing.assert_array_equal(np.concatenate([b.start_ms for b in blocks]), whole.step_start_ms)
    np.testing.assert_array_equal(
        np.concatenate([b.worker_load for b in blocks]), whole.worker_load
    )
    np.testing.assert_array_equal(seen["finish_step"], truth_finish)
    np.testing.assert_array_equal(seen["worker"], truth_worker)


def test_steps_awaiting_take_hold_only_their_own_rows() -> None:
    """While a fleet fills, each arrival cuts its stretch after a step or two; the steps
    kept for `take_steps` must hold those rows, not the whole stretch computed ahead (up to
    MAX_BLOCK_STEPS x G loads each: a G = 256 run held ~500 MiB that way)."""
    workers, n = 64, 600
    ready = np.arange(n, dtype=np.float64) * 3.0  # an arrival every 3 ms, steps of ~5+ ms
    run = FleetReplay(make_policy("jsq-pool"), workers=workers, batch=16, step_model=MODEL)
    run.add_requests(ready, np.full(n, 100), np.full(n, 5_000), np.full(n, -1))
    run.advance(ready[-1])
    loads = [block[3] for block in run._blocks]
    committed = sum(rows.shape[0] for rows in loads)
    held = sum((rows.base if rows.base is not None else rows).nbytes for rows in loads)
    assert committed > 100 and len(loads) > 100  # many stretches, each cut early
    assert held <= 2 * committed * workers * 8, (held, committed)
    steps = run.take_steps()
    assert steps.worker_load.shape == (committed, workers)
