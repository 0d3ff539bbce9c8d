"""Routing policies: one interface, a name registry, plain data in and out.

Names are the ones the CLI, configs, the replay JSON and the tests use: `random`, `rr`,
`jsq`, `p2c`, `ltl`, `vllm-dplb`, `br0`, and BR-H as `brh-survival`, `brh-exactmatch`,
`brh-oracle` (or `brh` with an explicit predictor).
"""

from __future__ import annotations

from shadow.policies.balanceroute import (
    BalanceRouteConfig,
    BalanceRouteHorizon,
    BalanceRouteZero,
    horizon_scores,
    project_loads,
    two_stage_admission,
)
from shadow.policies.base import Policy
from shadow.policies.baselines import BASELINES
from shadow.policies.snapshot import (
    NO_KEY,
    ActiveRequest,
    ActiveSet,
    Admission,
    FleetSnapshot,
    ReadyPool,
    ReadyRequest,
    WorkerView,
    prompt_key_id,
)
from shadow.predict.predictors import PREDICTORS, Predictor, make_predictor

BASELINE_POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in BASELINES}
POLICY_NAMES: tuple[str, ...] = (
    *BASELINE_POLICIES,
    "br0",
    *(f"brh-{predictor}" for predictor in PREDICTORS),
)


def make_policy(
    name: str,
    *,
    seed: int = 0,
    config: BalanceRouteConfig | None = None,
    predictor: Predictor | None = None,
) -> Policy:
    """Build a policy by name. `brh-NAME` builds BR-H with a fresh predictor `NAME` unless
    one is passed (a predictor shared with the replay engine or mirror learns from it)."""
    if name in BASELINE_POLICIES:
        return BASELINE_POLICIES[name](seed=seed)  # type: ignore[call-arg]
    if name == "br0":
        return BalanceRouteZero(config, seed=seed)
    if name == "brh" or name.startswith("brh-"):
        predictor_name = name.removeprefix("brh").removeprefix("-")
        if predictor is None:
            if not predictor_name:
                raise ValueError("policy 'brh' needs a predictor; name it as brh-survival, ...")
            predictor = make_predictor(predictor_name)
        elif predictor_name and predictor.name != predictor_name:
            raise ValueError(f"policy {name!r} was given a {predictor.name!r} predictor")
        return BalanceRouteHorizon(predictor, config, seed=seed)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


def make_aa_policy(name: str, seed: int = 1) -> Policy:
    """The incumbent against itself for the A/A noise floor: the same rule with its
    arbitrary choices (ties, randomness) drawn differently."""
    cls = BASELINE_POLICIES.get(name)
    if cls is not None and name in ("jsq", "ltl"):
        return cls(seed=seed, random_ties=True)  # type: ignore[call-arg]
    return make_policy(name, seed=seed)


__all__ = [
    "NO_KEY",
    "POLICY_NAMES",
    "ActiveRequest",
    "ActiveSet",
    "Admission",
    "BalanceRouteConfig",
    "BalanceRouteHorizon",
    "BalanceRouteZero",
    "FleetSnapshot",
    "Policy",
    "ReadyPool",
    "ReadyRequest",
    "WorkerView",
    "horizon_scores",
    "make_aa_policy",
    "make_policy",
    "project_loads",
    "prompt_key_id",
    "two_stage_admission",
]
