"""The routers that dispatch on arrival into worker queues, and the engine's queues:
each rule by hand, and the replay's commitment (sticky, FCFS per worker)."""

import numpy as np
import pytest

from shadow.policies import (
    ActiveRequest,
    ActiveSet,
    FleetSnapshot,
    HoldsWork,
    ReadyPool,
    ReadyRequest,
    WorkerView,
    make_policy,
)
from shadow.policies.queued import BODY_BYTES_PER_TOKEN, BODY_ENVELOPE_BYTES, body_bytes
from shadow.replay import replay
from shadow.replay.workload import StepModel, Workload

#: every step 1 ms whatever the load, so step numbers and times say the same
ONE_MS = StepModel(a_ms_per_token=0.0, b_ms=1.0)

QUEUED = ("jsq", "ascend-proxy", "vllm-dplb", "vllm-dplb-legacy", "br0-bypass")


@pytest.mark.parametrize("name", QUEUED)
def test_routers_with_worker_queues_declare_it_and_dispatch_every_request(name):
    """Every ready request goes somewhere, full fleet or not: no pool, no capacity check."""
    policy = make_policy(name)
    assert policy.holds_work is HoldsWork.WORKER_QUEUES and policy.dispatches_on_arrival
    full = FleetSnapshot.from_workers(
        [WorkerView(g, 1, [ActiveRequest(f"a{g}", 100, 0)]) for g in range(3)]
    )
    pool = ReadyPool.from_requests([ReadyRequest(i, 50) for i in range(5)])
    admissions = policy.admit(full, pool)
    assert [a.request_id for a in admissions] == list(range(5))


@pytest.mark.parametrize("name", ["random", "jsq-pool", "br0", "bf-io"])
def test_pool_policies_declare_the_pool(name):
    assert make_policy(name).holds_work is HoldsWork.POOL


def test_jsq_counts_queued_requests_and_sends_to_a_full_worker():
    """w0 runs 1 of 1 slot, w1 runs 1 of 4 with 2 queued: in flight 1 vs 3, so w0, full."""
    snapshot = FleetSnapshot.from_active(
        [1, 4], ActiveSet.from_arrays([0, 1], [10, 10], [0, 0]), waiting=[0, 2]
    )
    pool = ReadyPool.from_arrays(["x", "y", "z"], [5, 5, 5])
    # x: 1 vs 3 -> w0; y: 2 vs 3 -> w0; z: 3 vs 3 -> tie, lowest index -> w0
    assert [a.worker for a in make_policy("jsq").admit(snapshot, pool)] == [0, 0, 0]
    # the pooled JSQ sees one free slot, on w1
    assert [a.worker for a in make_policy("jsq-pool").admit(snapshot, pool)] == [1, 1, 1]


def test_ascend_proxy_counts_request_bytes_not_requests():
    """w0: one 1,000-token prompt in flight; w1: two of 100 (and full). Bytes decide."""
    snapshot = FleetSnapshot.from_workers(
        [
            WorkerView(0, 4, [ActiveRequest("a", 1000, 7)]),
            WorkerView(1, 2, [ActiveRequest("b", 100, 0), ActiveRequest("c", 100, 3)]),
        ]
    )
    w0 = body_bytes(1000)
    w1 = 2 * body_bytes(100)
    assert w1 < w0
    pool = ReadyPool.from_arrays(["x"], [400])
    assert make_policy("ascend-proxy").admit(snapshot, pool)[0].worker == 1
    assert make_policy("jsq").admit(snapshot, pool)[0].worker == 0
    # Generated tokens do not count (a body's length is fixed): only prompts and envelopes.
    assert body_bytes(100) == BODY_BYTES_PER_TOKEN * 100 + BODY_ENVELOPE_BYTES


def test_ascend_proxy_ties_go_to_the_lowest_index_and_dispatches_add_bytes():
    empty = FleetSnapshot.from_workers([WorkerView(g, 2) for g in range(3)])
    pool = ReadyPool.from_arrays(["x", "y", "z", "w"], [100, 100, 50, 10])
    # x -> 0; y -> 1; z -> 2 (0 bytes); w -> 2 (the least bytes: 50-token body)
    assert [a.worker for a in make_policy("ascend-proxy").admit(empty, pool)] == [0, 1, 2, 2]


def test_vllm_dplb_current_rule_against_legacy():
    """rank 0: 0 running, 1 waiting; rank 1: 3 running. Current: max(1, 1) = 1 vs 3 ->
    rank 0. Legacy: 4*1 + 0 = 4 vs 3 -> rank 1."""
    snapshot = FleetSnapshot.from_active(
        [4, 4], ActiveSet.from_arrays([1, 1, 1], [10, 10, 10], [0, 0, 0]), waiting=[1, 0]
    )
    pool = ReadyPool.from_arrays(["x"], [5])
    assert make_policy("vllm-dplb").admit(snapshot, pool)[0].worker == 0
    assert make_policy("vllm-dplb-legacy").admit(snapshot, pool)[0].worker == 1


def test_vllm_dplb_penalises_waiting_on_a_rank_with_kv_above_half():
    """Both ranks score 2 by counts; rank 0 has 1 waiting at KV 0.9: + 6 * 1 * 0.4."""
    policy = make_policy("vllm-dplb")
    capacity = policy.kv_capacity_tokens
    snapshot = FleetSnapshot.from_active(
        [4, 4],
        ActiveSet.from_arrays([0, 1, 1], [int(0.9 * capacity), 10, 10], [0, 0, 0]),
        waiting=[1, 0],
    )
    pool = ReadyPool.from_arrays(["x"], [5])
    assert policy.admit(snapshot, pool)[0].worker == 1
    unloaded = FleetSnapshot.from_active(
        [4, 4], ActiveSet.from_arrays([0, 1, 1], [10, 10, 10], [0, 0, 0]), waiting=[1, 0]
    )
    assert make_policy("vllm-dplb").admit(unloaded, pool)[0].worker == 0


def test_vllm_dplb_ties_rotate_and_legacy_ties_do_not():
    empty = FleetSnapshot.from_workers([WorkerView(g, 4) for g in range(3)])
    pool = ReadyPool.from_arrays(["x"], [5])
    current = make_policy("vllm-dplb")
    legacy = make_policy("vllm-dplb-legacy")
    assert [current.admit(empty, pool)[0].worker for _ in range(4)] == [0, 1, 2, 0]
    assert [legacy.admit(empty, pool)[0].worker for _ in range(4)] == [0, 0, 0, 0]


def test_vllm_dplb_reads_published_counts_only_every_100_ms():
    """Published at t = 0 with rank 0 busy; at t = 50 ms rank 0 has emptied but the
    published counts still say busy; at t = 100 ms they are republished."""
    busy = ActiveSet.from_arrays([0, 0, 0, 0], [10] * 4, [0] * 4)
    policy = make_policy("vllm-dplb")
    pool = ReadyPool.from_arrays(["x"], [5])

    def at(now_ms: float, active: ActiveSet, waiting: list[int]) -> FleetSnapshot:
        snapshot = FleetSnapshot.from_active([8, 8], active, waiting=waiting)
        return FleetSnapshot(
            snapshot.worker_ids, snapshot.capacity, snapshot.active_count, snapshot.load,
            snapshot.active, snapshot.waiting, None, now_ms,
        )  # fmt: skip

    assert policy.admit(at(0.0, busy, [3, 0]), pool)[0].worker == 1
    # rank 0 drained, rank 1 runs one: the front-end's own in-flight count says 0 vs 1,
    # but until the next publication the published counts say 3 + 4 = 7 vs 0
    drained = ActiveSet.from_arrays([1], [10], [0])
    assert policy.admit(at(50.0, drained, [0, 0]), pool)[0].worker == 1
    assert policy.admit(at(100.0, drained, [0, 0]), pool)[0].worker == 0


def test_br0_bypass_scores_against_the_queued_tokens_too():
    """Loads 1,000 / 0 with 1,500 tokens queued on w1: virtual 1,000 / 1,500, so a
    200-token prompt fits w0's margin of 500 (BR-0 on running load alone picks w1)."""
    active = ActiveSet.from_arrays([0], [1000], [0])
    snapshot = FleetSnapshot.from_active([4, 4], active, waiting=[0, 1])
    snapshot = FleetSnapshot(
        snapshot.worker_ids, snapshot.capacity, snapshot.active_count, snapshot.load,
        snapshot.active, snapshot.waiting, np.array([0, 1500]),
    )  # fmt: skip
    pool = ReadyPool.from_arrays(["x"], [200])
    assert make_policy("br0-bypass").admit(snapshot, pool)[0].worker == 0
    assert make_policy("br0").admit(snapshot, pool)[0].worker == 1


def _sticky_workload() -> Workload:
    """r0 (10 steps) and r1 (2 steps) ready at 0; r2 (1 step) ready at 0.5 ms."""
    return Workload.from_arrays("sticky", [0.0, 0.0, 0.0005], [10, 10, 10], [10, 2, 1])


def test_a_queued_request_is_sticky_and_starts_fcfs_on_its_own_worker():
    """B = 1. Under `jsq`, r2 arrives while both workers run one request: a tie, so it is
    committed to w0 at the end of step 0 and waits there until r0 finishes (step 9),
    although w1 frees its slot after step 1. The pooled `jsq-pool` starts it on w1."""
    queued = replay(_sticky_workload(), make_policy("jsq"), workers=2, batch=1, step_model=ONE_MS)
    assert queued.worker.tolist() == [0, 1, 0]
    assert queued.admit_step.tolist() == [0, 0, 10]
    assert queued.admit_ms[2] == pytest.approx(10.0)
    pooled = replay(
        _sticky_workload(), make_policy("jsq-pool"), workers=2, batch=1, step_model=ONE_MS
    )
    assert pooled.worker.tolist() == [0, 1, 1]
    assert pooled.admit_step.tolist() == [0, 0, 2]
    assert (queued.worker_active <= 1).all()


def test_a_worker_queue_admits_in_dispatch_order():
    """Four requests for one worker of B = 1: they run one after another in ready order."""
    workload = Workload.from_arrays("fifo", [0.0, 0.0001, 0.0002, 0.0003], [5] * 4, [3, 1, 2, 1])
    result = replay(workload, make_policy("jsq"), workers=1, batch=1, step_model=ONE_MS)
    assert result.admit_step.tolist() == [0, 3, 4, 6]
    assert result.finish_step.tolist() == [2, 3, 5, 6]


def test_deciding_on_arrival_commits_on_the_state_of_the_step_it_arrives_in():
    """The live router's timing: r2 is dispatched during step 0 (both workers busy, a tie
    to w0), and still waits there for r0, as at the boundary."""
    live = replay(
        _sticky_workload(),
        make_policy("jsq"),
        workers=2,
        batch=1,
        step_model=ONE_MS,
        decide_on_arrival=True,
    )
    assert live.worker.tolist() == [0, 1, 0]
    assert live.admit_step.tolist() == [0, 0, 10]
