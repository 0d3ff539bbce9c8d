"""The policy registry: the names it lists and what it builds by name."""

from __future__ import annotations

import pytest

from shadow.policies import (
    POLICY_NAMES,
    BalanceRouteHorizon,
    make_policy,
    policy_names,
    register_policy,
)
from shadow.predict import ExactMatchPredictor, SurvivalPredictor

#: POLICY_NAMES in registration order; the order is public (CLI help, `shadow replay`'s
#: default): the pool baselines, the routers with worker queues, BR-0/BR-H, BF-IO
REGISTERED_NAMES = (
    "random", "rr", "jsq-pool", "p2c", "ltl",
    "jsq", "ascend-proxy", "vllm-dplb", "vllm-dplb-legacy", "br0-bypass",
    "br0", "brh-survival", "brh-exactmatch", "brh-oracle", "bf-io-h0", "bf-io",
)  # fmt: skip


def test_registry_names_are_the_published_order():
    assert POLICY_NAMES == REGISTERED_NAMES


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_listed_name_builds(name):
    assert make_policy(name, seed=3) is not None


def test_registered_classes_carry_their_name():
    assert [make_policy(n).name for n in POLICY_NAMES[:7]] == list(POLICY_NAMES[:7])


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown policy 'nope'") as error:
        make_policy("nope")
    # every name registered now (a test module's policies too: tests/gate_policies.py)
    assert str(error.value).endswith(", ".join(policy_names()))


def test_brh_takes_a_passed_predictor_and_checks_its_kind():
    predictor = SurvivalPredictor()
    policy = make_policy("brh-survival", predictor=predictor)
    assert isinstance(policy, BalanceRouteHorizon) and policy.predictor is predictor
    assert make_policy("brh", predictor=predictor).predictor is predictor
    with pytest.raises(ValueError, match="needs a predictor"):
        make_policy("brh")
    with pytest.raises(ValueError, match="given a 'exactmatch' predictor"):
        make_policy("brh-survival", predictor=ExactMatchPredictor())
    assert "brh" not in POLICY_NAMES


def test_a_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="registered twice"):
        register_policy("jsq")(type("Again", (), {}))
