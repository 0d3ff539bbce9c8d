"""The policy registry: the names it lists and what it builds by name."""

from __future__ import annotations

import pytest

from shadow.policies import POLICY_NAMES, BalanceRouteHorizon, make_policy, register_policy
from shadow.predict import ExactMatchPredictor, SurvivalPredictor

#: POLICY_NAMES as it was built by hand before the registry; the order is public (CLI help)
NAMES_BEFORE_THE_REGISTRY = (
    "random", "rr", "jsq", "p2c", "ltl", "vllm-dplb",
    "br0", "brh-survival", "brh-exactmatch", "brh-oracle",
)  # fmt: skip


def test_registry_names_equal_the_old_tuple():
    assert POLICY_NAMES == NAMES_BEFORE_THE_REGISTRY


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_listed_name_builds(name):
    assert make_policy(name, seed=3) is not None


def test_registered_classes_carry_their_name():
    assert [make_policy(n).name for n in POLICY_NAMES[:7]] == list(POLICY_NAMES[:7])


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown policy 'nope'") as error:
        make_policy("nope")
    assert str(error.value).endswith(", ".join(POLICY_NAMES))


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
