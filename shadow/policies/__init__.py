"""Routing policies: one interface, a name registry, plain data in and out.

Names are the ones the CLI, configs, the replay JSON and the tests use: the pool
baselines `random`, `rr`, `jsq-pool`, `p2c`, `ltl`; the routers that dispatch on arrival
into worker queues `jsq`, `ascend-proxy`, `vllm-dplb`, `vllm-dplb-legacy`, `br0-bypass`;
`br0`, BR-H as `brh-survival`, `brh-exactmatch`, `brh-oracle` (or `brh` with an explicit
predictor); and BF-IO as `bf-io-h0`, `bf-io`. docs/POLICIES.md states each rule.
"""

from __future__ import annotations

# The registration order is the order of POLICY_NAMES: the pool baselines, the routers
# with worker queues, BR-0 and BR-H, then BF-IO.
from shadow.policies.baselines import JoinShortestQueuePolicy, LeastTokenLoadPolicy
from shadow.policies.queued import JoinShortestQueueDispatch

# isort: split
from shadow.policies.balanceroute import (
    BalanceRouteHorizon,
    BalanceRouteZero,
    horizon_scores,
    project_loads,
    two_stage_admission,
)

# isort: split
from shadow.policies.balanceroute_config import BalanceRouteConfig
from shadow.policies.base import HoldsWork, Policy
from shadow.policies.bfio import BalanceFutureIO
from shadow.policies.registry import (
    is_balance_route,
    make_policy,
    policy_names,
    register_policy,
)
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

POLICY_NAMES: tuple[str, ...] = policy_names()
#: the baselines whose arbitrary choices are ties, which `random_ties` draws at random
_TIE_BREAKING = {
    cls.name: cls
    for cls in (JoinShortestQueuePolicy, JoinShortestQueueDispatch, LeastTokenLoadPolicy)
}


def make_aa_policy(name: str, seed: int = 1) -> Policy:
    """The incumbent against itself for the A/A noise floor: the same rule with its
    arbitrary choices (ties, randomness) drawn differently."""
    cls = _TIE_BREAKING.get(name)
    if cls is not None:
        return cls(seed=seed, random_ties=True)
    return make_policy(name, seed=seed)


__all__ = [
    "NO_KEY",
    "POLICY_NAMES",
    "ActiveRequest",
    "ActiveSet",
    "Admission",
    "BalanceFutureIO",
    "BalanceRouteConfig",
    "BalanceRouteHorizon",
    "BalanceRouteZero",
    "FleetSnapshot",
    "HoldsWork",
    "Policy",
    "ReadyPool",
    "ReadyRequest",
    "WorkerView",
    "horizon_scores",
    "is_balance_route",
    "make_aa_policy",
    "make_policy",
    "policy_names",
    "project_loads",
    "prompt_key_id",
    "register_policy",
    "two_stage_admission",
]
