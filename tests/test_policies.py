import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow.bench.router import RouterCase, random_round
from shadow.policies import (
    POLICY_NAMES,
    ActiveRequest,
    ActiveSet,
    BalanceRouteConfig,
    BalanceRouteHorizon,
    BalanceRouteZero,
    FleetSnapshot,
    ReadyPool,
    ReadyRequest,
    WorkerView,
    make_policy,
    project_loads,
)
from shadow.policies.balanceroute import _CurrentLoads, _ProjectedLoads, two_stage_admission
from shadow.policies.baselines import JoinShortestQueuePolicy, RandomPolicy, SlotFillingPolicy
from shadow.policies.fscore import discounts
from shadow.policies.subset import best_subset
from shadow.predict import ExactMatchPredictor, OraclePredictor, SurvivalPredictor
from tests.strategies import pools, snapshots, trained

#: the pool policies (the ones with worker queues dispatch everything, full or not)
SLOT_POLICIES = [name for name in POLICY_NAMES if not make_policy(name).dispatches_on_arrival]
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(name: str, seed: int = 0):
    policy = make_policy(name, seed=seed)
    if name.startswith("brh-"):
        trained(policy.predictor, seed)
    return policy


@PROPERTY
@given(snapshots(), pools(), st.sampled_from(SLOT_POLICIES), st.integers(0, 3))
def test_no_policy_overfills_a_worker_or_admits_twice(snapshot, pool, name, seed):
    admissions = build(name, seed).admit(snapshot, pool)
    ids = [a.request_id for a in admissions]
    assert len(ids) == len(set(ids))
    assert set(ids) <= set(pool.request_ids)
    per_worker = Counter(a.worker for a in admissions)
    for g, worker in enumerate(snapshot.worker_ids):
        assert per_worker[worker] <= snapshot.free_slots[g]


@PROPERTY
@given(snapshots(), pools(), st.sampled_from(SLOT_POLICIES), st.integers(0, 3))
def test_every_policy_is_work_conserving(snapshot, pool, name, seed):
    admissions = build(name, seed).admit(snapshot, pool)
    assert len(admissions) == min(len(pool), int(snapshot.free_slots.sum()))
    if len(pool) and snapshot.free_slots.sum():
        assert admissions


@PROPERTY
@given(snapshots(), pools(), st.sampled_from(["survival", "exactmatch", "oracle"]))
def test_brh_with_zero_horizon_admits_exactly_what_br0_admits(snapshot, pool, predictor_name):
    predictor = {
        "survival": SurvivalPredictor,
        "exactmatch": ExactMatchPredictor,
        "oracle": OraclePredictor,
    }[predictor_name]()
    trained(predictor)
    # alpha and beta are overridden with (1, G) whenever H = 0, whatever they say here.
    config = BalanceRouteConfig(horizon=0, alpha=3.0, beta=5.0, gamma=0.5)
    brh = BalanceRouteHorizon(predictor, config).admit(snapshot, pool)
    br0 = BalanceRouteZero().admit(snapshot, pool)
    assert brh == br0


@PROPERTY
@given(snapshots(), pools(max_size=30), st.sampled_from(["br0", "brh-survival"]))
def test_rmax_sixteen_still_admits_correctly(snapshot, pool, name):
    policy = make_policy(name, config=BalanceRouteConfig(r_max=16, s_greedy=3))
    if name != "br0":
        trained(policy.predictor)
    admissions = policy.admit(snapshot, pool)
    assert len(admissions) == min(len(pool), int(snapshot.free_slots.sum()))


@PROPERTY
@given(snapshots(), st.integers(0, 8000), st.sampled_from(["br0", "brh-survival"]),
       st.integers(0, 12))  # fmt: skip
def test_one_request_goes_where_the_stage_rules_send_it(snapshot, prompt, name, s_greedy):
    """A round of one request (every round of the decision audit) skips the objective;
    the worker must still be the one the stage rules of BALANCEROUTE.md pick: with more
    than S_greedy free slots the emptiest (most free slots, then least load), else the
    largest safe margin among workers with a free slot (then most free slots)."""
    policy = make_policy(name, config=BalanceRouteConfig(s_greedy=s_greedy))
    if name != "br0":
        trained(policy.predictor)
    pool = ReadyPool.from_arrays(["only"], [prompt], [0])
    admissions = policy.admit(snapshot, pool)
    free = snapshot.free_slots.astype(np.int64)
    if free.sum() == 0:
        assert admissions == []
        return
    index = np.arange(free.shape[0])
    load = snapshot.load.astype(np.float64)
    if free.sum() > s_greedy:
        expected = int(np.lexsort((index, load, -free))[0])
    else:
        if name == "br0":
            margins = load.max() - load
        else:
            projection = policy.project(snapshot)
            margins = (projection.max(axis=0) - projection).min(axis=1)
        margins = np.where(free > 0, margins, -np.inf)
        expected = int(np.lexsort((index, -free, -margins))[0])
    assert [(a.request_id, a.worker) for a in admissions] == [
        ("only", snapshot.worker_ids[expected])
    ]


def _reference_round(picture, free, prompts, config):
    """The admission round as first written (BALANCEROUTE.md, step by step): every choice
    scored, one request or many. `two_stage_admission` skips scoring where one request is
    left or one candidate is offered; it must choose exactly what this chooses."""
    free = free.astype(np.int64)
    pool_size = prompts.shape[0]
    taken = np.zeros(pool_size, dtype=bool)
    decided = []
    slots = int(free.sum())
    worker_index = np.arange(free.shape[0])
    while slots > config.s_greedy and len(decided) < pool_size:
        g = int(np.lexsort((worker_index, picture.current, -free))[0])
        scores = picture.objective(g).values(prompts)
        scores[taken] = -np.inf
        i = int(np.argmax(scores))
        taken[i] = True
        picture.add(g, int(prompts[i]))
        free[g] -= 1
        slots -= 1
        decided.append((i, g))
    queue = np.flatnonzero(~taken).tolist()
    while queue and slots > 0:
        margins = np.where(free > 0, picture.safe_margins(), -np.inf)
        g = int(np.lexsort((worker_index, -free, -margins))[0])
        candidates = queue[: config.r_max]
        sizes = prompts[candidates]
        objective = picture.objective(g)
        choice = best_subset(objective, sizes.tolist(), int(free[g]))
        positions = choice.positions
        if choice.score <= 0:
            positions = (int(np.argmax(objective.values(sizes))),)
        for position in positions:
            i = candidates[position]
            picture.add(g, int(prompts[i]))
            free[g] -= 1
            slots -= 1
            decided.append((i, g))
        chosen = {candidates[p] for p in positions}
        queue = [i for i in queue[: config.r_max] if i not in chosen] + queue[config.r_max :]
    return decided


@PROPERTY
@given(snapshots(), pools(max_size=12), st.booleans(), st.integers(0, 12), st.integers(1, 4))
def test_the_round_chooses_what_the_fully_scored_round_chooses(
    snapshot, pool, horizon, s_greedy, r_max
):
    config = BalanceRouteConfig(s_greedy=s_greedy, r_max=r_max)
    if horizon:
        policy = BalanceRouteHorizon(trained(SurvivalPredictor()), config)
        projection = policy.project(snapshot)
        alpha, beta = config.coefficients(snapshot.workers)
        discount = discounts(config.horizon, config.gamma)

        def picture():
            return _ProjectedLoads(snapshot.load, projection.copy(), discount, alpha, beta)
    else:

        def picture():
            return _CurrentLoads(snapshot.load)

    free, prompts = snapshot.free_slots, pool.prompt_tokens
    expected = _reference_round(picture(), free, prompts, config)
    assert two_stage_admission(picture(), free, prompts, config) == expected


@PROPERTY
@given(
    snapshots(max_workers=6, max_batch=40),
    st.one_of(pools(max_size=120, max_prompt=40), pools(max_size=120, max_prompt=8000)),
    st.booleans(),
    st.integers(0, 3),
)
def test_a_long_stage_one_chooses_what_the_fully_scored_round_chooses(
    snapshot, pool, horizon, s_greedy
):
    """Stage 1 over a pool much wider than the scan's first reach (8 on each side of the
    peak), many equal sizes among them: the pool scan's choices must still be argmax's."""
    config = BalanceRouteConfig(s_greedy=s_greedy)
    if horizon:
        policy = BalanceRouteHorizon(trained(SurvivalPredictor()), config)
        projection = policy.project(snapshot)
        alpha, beta = config.coefficients(snapshot.workers)
        discount = discounts(config.horizon, config.gamma)

        def picture():
            return _ProjectedLoads(snapshot.load, projection.copy(), discount, alpha, beta)
    else:

        def picture():
            return _CurrentLoads(snapshot.load)

    free, prompts = snapshot.free_slots, pool.prompt_tokens
    expected = _reference_round(picture(), free, prompts, config)
    assert two_stage_admission(picture(), free, prompts, config) == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_g256_round_of_bench_router_chooses_what_the_fully_scored_round_chooses(seed):
    """The benchmark's own case (G = 256, B = 128, pool 4,096, 256 free), BR-0 and BR-H."""
    case = RouterCase(256, 128, 4096, 256)
    snapshot, pool = random_round(np.random.default_rng(seed), case)
    config = BalanceRouteConfig()
    brh = BalanceRouteHorizon(trained(SurvivalPredictor(), seed, samples=2000), config)
    projection = brh.project(snapshot)
    alpha, beta = config.coefficients(snapshot.workers)
    discount = discounts(config.horizon, config.gamma)
    br0_config = BalanceRouteZero().config
    for picture, round_config in (
        (lambda: _CurrentLoads(snapshot.load), br0_config),
        (lambda: _ProjectedLoads(snapshot.load, projection.copy(), discount, alpha, beta), config),
    ):
        expected = _reference_round(
            picture(), snapshot.free_slots, pool.prompt_tokens, round_config
        )
        got = two_stage_admission(picture(), snapshot.free_slots, pool.prompt_tokens, round_config)
        assert got == expected
        assert len(got) == 256


@pytest.mark.parametrize("name", ["br0", "brh-survival", "brh-oracle"])
def test_starvation_guard_admits_a_prompt_larger_than_every_margin(name):
    workers = [
        WorkerView(g, 2, [ActiveRequest(f"a{g}", 1000 + 10 * g, 0, output_tokens=500)])
        for g in range(4)
    ]
    snapshot = FleetSnapshot.from_workers(workers)
    pool = ReadyPool.from_requests([ReadyRequest("huge", 10_000_000)])
    policy = build(name)
    admissions = policy.admit(snapshot, pool)
    assert [a.request_id for a in admissions] == ["huge"]


def test_br0_fills_the_hole_exactly():
    """Loads 1000/0: small + exact (10 + 990) fill worker 1's hole exactly, F = 1000; the
    big prompt then goes to worker 0, which has more free slots at equal margins."""
    snapshot = FleetSnapshot.from_workers(
        [WorkerView(0, 4, [ActiveRequest("a", 1000, 0)]), WorkerView(1, 4, [])]
    )
    pool = ReadyPool.from_requests(
        [ReadyRequest("small", 10), ReadyRequest("exact", 990), ReadyRequest("big", 3000)]
    )
    admissions = BalanceRouteZero(BalanceRouteConfig(s_greedy=100)).admit(snapshot, pool)
    assert admissions == [("small", 1), ("exact", 1), ("big", 0)]


def test_jsq_pool_picks_fewest_active_and_breaks_ties_low():
    snapshot = FleetSnapshot.from_workers(
        [
            WorkerView("w0", 4, [ActiveRequest("a", 1, 0), ActiveRequest("b", 1, 0)]),
            WorkerView("w1", 4, [ActiveRequest("c", 1, 0)]),
            WorkerView("w2", 4, [ActiveRequest("d", 1, 0)]),
        ]
    )
    pool = ReadyPool.from_requests([ReadyRequest(i, 5) for i in "xyz"])
    assert [a.worker for a in make_policy("jsq-pool").admit(snapshot, pool)] == ["w1", "w2", "w0"]


def test_ltl_and_rr_by_hand():
    snapshot = FleetSnapshot.from_workers(
        [WorkerView(0, 2, [ActiveRequest("a", 900, 0)]), WorkerView(1, 2, []), WorkerView(2, 1, [])]
    )
    pool = ReadyPool.from_requests([ReadyRequest("x", 500), ReadyRequest("y", 100)])
    assert [a.worker for a in make_policy("ltl").admit(snapshot, pool)] == [1, 2]
    rr = make_policy("rr")
    assert [a.worker for a in rr.admit(snapshot, pool)] == [0, 1]
    assert [a.worker for a in rr.admit(snapshot, pool)] == [2, 0]  # the cursor persists


def test_vllm_dplb_legacy_scores_four_waiting_plus_running():
    snapshot = FleetSnapshot.from_active(
        [4, 4], ActiveSet.from_arrays([0, 0, 0], [1, 1, 1], [0, 0, 0]), waiting=[0, 1]
    )
    # rank 0: 4*0 + 3 = 3; rank 1: 4*1 + 0 = 4 -> rank 0, then 7 vs 4 -> rank 1, then 7 vs 8.
    pool = ReadyPool.from_arrays(["x", "y", "z"], [1, 1, 1])
    assert [a.worker for a in make_policy("vllm-dplb-legacy").admit(snapshot, pool)] == [0, 1, 0]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_same_seed_same_decisions(name):
    rng = np.random.default_rng(7)
    snapshot = FleetSnapshot.from_active(
        [8] * 6,
        ActiveSet.from_arrays(
            rng.integers(0, 6, 30),
            rng.integers(1, 5000, 30),
            rng.integers(0, 100, 30),
            remaining=rng.integers(1, 100, 30),
        ),
    )
    pool = ReadyPool.from_arrays(list(range(40)), rng.integers(1, 5000, 40))
    first = [build(name, seed=3).admit(snapshot, pool) for _ in range(2)]
    assert first[0] == first[1]


def test_projection_with_the_oracle_is_the_exact_future_load():
    active = ActiveSet.from_arrays(
        worker=[0, 0, 1], prompt_tokens=[100, 200, 50], generated=[5, 0, 10], remaining=[2, 5, 1]
    )
    snapshot = FleetSnapshot.from_active([4, 4], active)
    horizon = 4
    contribution = OraclePredictor().predict(active, horizon).contribution
    projection = project_loads(snapshot.load, active, contribution, horizon)
    expected = np.zeros((2, horizon + 1))
    for g, s, a, r in zip(
        active.worker, active.prompt_tokens, active.generated, active.remaining, strict=True
    ):
        for h in range(horizon + 1):
            if h < r:
                expected[g, h] += s + a + h
    assert projection.tolist() == expected.tolist()


def test_bad_config_is_rejected_with_the_field_named():
    with pytest.raises(ValueError, match="gamma"):
        BalanceRouteConfig(gamma=0)
    with pytest.raises(ValueError, match="r_max"):
        BalanceRouteConfig(r_max=0)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope")


def test_the_registry_knows_the_balance_route_family():
    """Sweeps vary BR parameters and benchmarks apply the BR targets by this flag, not by
    reading a name's prefix."""
    from shadow.policies import POLICY_NAMES, is_balance_route

    family = {name for name in POLICY_NAMES if is_balance_route(name)}
    assert family == {"br0", "brh-survival", "brh-exactmatch", "brh-oracle"}
    assert is_balance_route("brh") and not is_balance_route("no-such-policy")


@settings(max_examples=300, deadline=None)
@given(snapshots(max_workers=12), pools(max_size=30), st.integers(0, 3), st.integers(0, 2**16))
def test_pool_baselines_admit_as_their_choose_would(snapshot, pool, lowered, seed) -> None:
    """`jsq-pool` (both tie rules) and `random` admit on arrays or with a kept list of
    open workers; each round is the one `choose`, asked request by request, makes, also
    when a lowered capacity leaves a worker over it (negative free slots)."""
    capacity = np.maximum(snapshot.capacity - lowered, 0) if seed % 2 else snapshot.capacity
    snapshot = dataclasses.replace(snapshot, capacity=capacity)
    for make in (
        lambda: JoinShortestQueuePolicy(),
        lambda: JoinShortestQueuePolicy(seed=seed, random_ties=True),
        lambda: RandomPolicy(seed=seed),
    ):
        fast, by_choose = make(), make()
        for _ in range(2):  # a second round continues each one's random stream
            assert fast.admit(snapshot, pool) == SlotFillingPolicy.admit(by_choose, snapshot, pool)
