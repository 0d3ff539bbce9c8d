"""A policy that says it never reads the running requests' rows (`reads_active = False`)
decides the same with them as without them; the replay gives such a policy's rounds none.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.policies import ActiveSet, FleetSnapshot, Policy, ReadyPool, make_policy, policy_names
from shadow.policies.baselines import JoinShortestQueuePolicy
from shadow.replay import replay
from shadow.replay.workload import StepModel
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime

NOT_READING = [name for name in policy_names() if not make_policy(name).reads_active]


@st.composite
def rounds(draw):
    workers = draw(st.integers(1, 6))
    capacity = np.array(draw(st.lists(st.integers(0, 6), min_size=workers, max_size=workers)))
    counts = [draw(st.integers(0, int(c))) for c in capacity]
    worker = np.repeat(np.arange(workers), counts)
    n = int(worker.shape[0])
    prompts = np.array(draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n)), np.int64)
    generated = np.array(draw(st.lists(st.integers(0, 900), min_size=n, max_size=n)), np.int64)
    rows = ActiveSet.from_arrays(worker, prompts, generated, remaining=np.full(n, 7))
    snapshot = FleetSnapshot.from_active(capacity, rows)
    pool_size = draw(st.integers(1, 12))
    pool = ReadyPool(
        [f"r{i}" for i in range(pool_size)],
        np.array(draw(st.lists(st.integers(1, 8000), min_size=pool_size, max_size=pool_size))),
        np.arange(pool_size, dtype=np.int64),
    )
    return snapshot, pool


def _without_rows(snapshot: FleetSnapshot) -> FleetSnapshot:
    return FleetSnapshot(snapshot.worker_ids, snapshot.capacity, snapshot.active_count,
                         snapshot.load, ActiveSet.empty(), snapshot.waiting,
                         snapshot.waiting_tokens, snapshot.now_ms)  # fmt: skip


def test_the_baselines_and_br0_say_they_read_no_rows():
    assert {"jsq-pool", "random", "rr", "br0"} <= set(NOT_READING)
    assert make_policy("brh-survival").reads_active
    assert make_policy("ascend-proxy").reads_active  # counts running tokens per worker


@settings(max_examples=150, deadline=None)
@given(st.lists(rounds(), min_size=1, max_size=4), st.integers(0, 99))
def test_a_policy_that_reads_no_rows_decides_the_same_without_them(snapshots, seed):
    for name in NOT_READING:
        with_rows, without = make_policy(name, seed=seed), make_policy(name, seed=seed)
        for snapshot, pool in snapshots:  # several rounds: a cursor or a generator moves
            assert with_rows.admit(snapshot, pool) == without.admit(_without_rows(snapshot), pool)


def test_a_subclass_reads_the_rows_unless_it_says_otherwise():
    class Custom(JoinShortestQueuePolicy):
        pass

    class Declared(JoinShortestQueuePolicy):
        reads_active = False

    assert Custom().reads_active and not Declared().reads_active
    assert issubclass(Custom, Policy)


def test_the_replay_without_rows_is_the_replay_with_them():
    """JSQ replayed as itself (no rows) and as a subclass that takes them: the same run."""

    class WithRows(JoinShortestQueuePolicy):
        name = "jsq-pool"

    model = StepModel()
    workload = retime(generate("paper-azure2024", seed=3, n=600), load=1.0, workers=4,
                      batch=16, step_model=model)  # fmt: skip
    plain = replay(workload, make_policy("jsq-pool"), workers=4, batch=16, step_model=model)
    rows = replay(workload, WithRows(), workers=4, batch=16, step_model=model)
    assert WithRows.reads_active and not make_policy("jsq-pool").reads_active
    for column in ("worker", "admit_step", "finish_step", "step_end_ms", "worker_load"):
        assert np.array_equal(getattr(plain, column), getattr(rows, column)), column
