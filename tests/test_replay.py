from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest

from shadow.analysis.metrics import summarize
from shadow.policies import POLICY_NAMES, make_policy
from shadow.replay import InitialRequest, replay
from shadow.replay.events import iter_events
from shadow.replay.workload import StepModel, Workload

HAND = StepModel(a_ms_per_token=1.0, b_ms=5.0)


def hand_workload() -> Workload:
    # Three requests ready at 0: prompts 10/20/30 tokens, outputs 2/3/1 tokens.
    return Workload.from_arrays("hand", [0, 0, 0], [10, 20, 30], [2, 3, 1])


def test_two_workers_three_requests_every_metric_by_hand():
    """JSQ: r0 -> w0, r1 -> w1, r2 -> w0 (tie on one active each, lowest index).

    step 0: w0 = 10 + 30 = 40, w1 = 20          T = 40 + 5 = 45   (r2 finishes)
    step 1: w0 = 10 + 1 = 11,  w1 = 20 + 1 = 21 T = 21 + 5 = 26   (r0 finishes)
    step 2: w0 = 0,            w1 = 20 + 2 = 22 T = 22 + 5 = 27   (r1 finishes)
    """
    result = replay(hand_workload(), make_policy("jsq-pool"), workers=2, batch=2, step_model=HAND)
    assert result.worker_load.tolist() == [[40, 20], [11, 21], [0, 22]]
    assert result.worker_active.tolist() == [[2, 1], [1, 1], [0, 1]]
    assert result.step_duration_ms.tolist() == [45.0, 26.0, 27.0]
    assert result.worker.tolist() == [0, 1, 0]
    metrics = summarize(result)
    assert metrics["imbalance_mean"] == pytest.approx((20 + 10 + 22) / 3)
    assert metrics["gap_mean"] == pytest.approx((20 + 10 + 22) / 3)
    # idle: sum_k sum_g (T_step - T_g) = a * sum_k gap_k = 52; over G * sum T = 2 * 98.
    assert metrics["idle_frac"] == pytest.approx(52 / (2 * 98))
    assert metrics["output_tokens"] == 6
    assert metrics["makespan_s"] == pytest.approx(0.098)
    assert metrics["throughput_tok_s"] == pytest.approx(6 / 0.098)
    # TPOT: r0 (45 -> 71) / 1 = 26; r1 (45 -> 98) / 2 = 26.5; r2 has one token: excluded.
    assert metrics["tpot_p50_ms"] == pytest.approx(26.25)
    assert metrics["tpot_p99_ms"] == pytest.approx(26 + 0.99 * 0.5)
    assert metrics["pool_wait_p95_ms"] == 0.0
    assert metrics["steps"] == 3


def test_pool_wait_idle_jumps_and_late_arrivals_by_hand():
    """One worker, one slot: r1 waits for r0; r2 arrives after an idle gap."""
    workload = Workload.from_arrays("wait", [0.0, 0.001, 1.0], [100, 100, 100], [2, 1, 1])
    result = replay(workload, make_policy("jsq-pool"), workers=1, batch=1, step_model=HAND)
    # r0: steps 0-1 (105, 106 ms); r1 admitted at 211 ms, one step (105); r2 at 1000 ms.
    assert result.step_start_ms.tolist() == [0.0, 105.0, 211.0, 1000.0]
    assert result.admit_ms.tolist() == [0.0, 211.0, 1000.0]
    metrics = summarize(result)
    assert metrics["pool_wait_p95_ms"] == pytest.approx(np.percentile([0, 210, 0], 95))
    assert metrics["makespan_s"] == pytest.approx(1.105)


def test_initial_snapshot_starts_from_the_observed_state():
    initial = [InitialRequest(worker=1, prompt_tokens=50, generated=7, remaining=2)]
    workload = Workload.from_arrays("w", [0.0], [10], [1])
    result = replay(
        workload, make_policy("jsq-pool"), workers=2, batch=2, step_model=HAND, initial=initial
    )
    # The new request goes to the empty worker 0; worker 1 carries 50 + 7 then 50 + 8.
    assert result.worker_load.tolist() == [[10, 57], [0, 58]]
    assert summarize(result)["output_tokens"] == 1 + 2


def small_workload(seed: int = 1, n: int = 300) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload.from_arrays(
        "small",
        np.cumsum(rng.exponential(0.05, n)),
        rng.integers(10, 3000, n),
        rng.integers(1, 200, n),
        rng.integers(0, 20, n),
    )


def fold_loads(events, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """An independent fold of the event stream: per step and worker, KV load and running."""
    prompts, active = {}, defaultdict(dict)
    loads, running = {}, {}
    for event in events:
        kind = event["type"]
        if kind == "ready":
            prompts[event["request_id"]] = event["prompt_tokens"]
        elif kind == "dispatch":
            active[event["worker"]][event["request_id"]] = [prompts[event["request_id"]], 0]
        elif kind == "engine_step":
            g, k = event["worker"], event["step"]
            loads[k, g] = sum(p + a for p, a in active[g].values())
            running[k, g] = len(active[g])
            assert event["kv_tokens"] == loads[k, g]
            for state in active[g].values():
                state[1] += 1
        elif kind == "progress":
            owner = next(g for g in active if event["request_id"] in active[g])
            assert active[owner][event["request_id"]][1] == event["generated"]
        elif kind == "finish":
            owner = next(g for g in active if event["request_id"] in active[g])
            assert active[owner].pop(event["request_id"])[1] == event["output_tokens"]
    steps = max(k for k, _ in loads) + 1
    out_loads = np.zeros((steps, workers), dtype=np.int64)
    out_running = np.zeros((steps, workers), dtype=np.int64)
    for (k, g), value in loads.items():
        out_loads[k, g] = value
        out_running[k, g] = running[k, g]
    return out_loads, out_running


@pytest.mark.parametrize("name", ["jsq", "brh-survival", "vllm-dplb"])
def test_emitted_events_fold_back_into_the_engine_loads(name):
    workload = small_workload()
    result = replay(workload, make_policy(name), workers=3, batch=8)
    events = list(iter_events(result, workload.prompt_keys, progress_every=16))
    loads, running = fold_loads(events, 3)
    assert np.array_equal(loads, result.worker_load)
    assert np.array_equal(running, result.worker_active)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(a["ts"] <= b["ts"] for a, b in pairwise(events))
    counts = defaultdict(int)
    for event in events:
        counts[event["type"]] += 1
    assert counts["ready"] == counts["dispatch"] == counts["finish"] == len(workload)
    assert counts["engine_step"] == 3 * result.steps
    assert counts["worker"] == 3


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_replays_to_completion_within_bounds(name):
    workload = small_workload(seed=4, n=200)
    result = replay(workload, make_policy(name, seed=2), workers=4, batch=6)
    assert (result.worker_active <= 6).all()
    assert (result.admit_step >= 0).all() and (result.worker >= 0).all()
    assert (result.admit_ms >= result.ready_ms).all()
    metrics = summarize(result)
    assert metrics["output_tokens"] == int(workload.output_tokens.sum())
    # Loads are consistent with who was where: sum over workers equals the active KV.
    k = result.steps // 2
    alive = (result.admit_step <= k) & (result.finish_step >= k)
    kv = (result.prompt_tokens + (k - result.admit_step))[alive].sum()
    assert result.worker_load[k].sum() == kv


def test_same_seed_same_result_and_different_seed_differs():
    workload = small_workload(seed=5)
    runs = [replay(workload, make_policy("random", seed=s), workers=4, batch=6) for s in (1, 1, 2)]
    assert np.array_equal(runs[0].worker_load, runs[1].worker_load)
    assert np.array_equal(runs[0].worker, runs[1].worker)
    assert not np.array_equal(runs[0].worker, runs[2].worker)


def test_default_step_model_is_about_60_ms_at_full_batch_on_the_paper_preset():
    """The paper's decode step is ~60 ms; the default model's fixed part is a third."""
    from shadow.workloads.synthetic import generate
    from shadow.workloads.traces import retime

    model = StepModel()
    workload = retime(generate("paper-azure2024"), load=1.1, workers=8, batch=64, step_model=model)
    result = replay(workload, make_policy("jsq-pool"), workers=8, batch=64, step_model=model)
    full = (result.worker_active == 64).all(axis=1)
    assert full.sum() > 1000
    mean_full_ms = result.step_duration_ms[full].mean()
    assert 54.0 <= mean_full_ms <= 66.0, mean_full_ms
    assert model.b_ms / 60.0 == pytest.approx(1 / 3)
