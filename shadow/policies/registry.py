"""Policy names: one table from each name to what builds it, so the CLI, configs, the replay
JSON and the tests name policies the same way.

A policy module registers its policies where it defines them (`@register_policy("jsq")`);
`policy_names()` lists them in registration order and `make_policy` builds one by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from shadow.policies.balanceroute_config import BalanceRouteConfig
    from shadow.policies.base import Policy
    from shadow.predict.predictors import Predictor


class PolicyFactory(Protocol):
    """Builds one policy; `config` and `predictor` matter only to the BalanceRoute family."""

    def __call__(
        self, *, seed: int, config: BalanceRouteConfig | None, predictor: Predictor | None
    ) -> Policy: ...


Registered = TypeVar("Registered", bound=Callable[..., object])

_FACTORIES: dict[str, PolicyFactory] = {}
#: registered names that `policy_names()` leaves out (`brh` needs a predictor passed in)
_UNLISTED: set[str] = set()
#: the names that take a `BalanceRouteConfig` (BR-0 and every BR-H)
_BALANCE_ROUTE: set[str] = set()


def register_policy(
    name: str, *, listed: bool = True, balance_route: bool = False
) -> Callable[[Registered], Registered]:
    """Register a policy class under `name` (it becomes the class's `name`; it is built as
    `cls(seed=seed)`), or a `PolicyFactory` function for policies that take more.
    `balance_route`: the policy reads a `BalanceRouteConfig` (sweeps vary its parameters,
    benchmarks hold it to the BR targets)."""

    def register(target: Registered) -> Registered:
        if name in _FACTORIES:
            raise ValueError(f"policy {name!r} is registered twice")
        if isinstance(target, type):
            target.name = name  # type: ignore[attr-defined]
            _FACTORIES[name] = lambda *, seed, config, predictor: target(seed=seed)
        else:
            _FACTORIES[name] = target  # type: ignore[assignment]
        if not listed:
            _UNLISTED.add(name)
        if balance_route:
            _BALANCE_ROUTE.add(name)
        return target

    return register


def policy_names() -> tuple[str, ...]:
    """Every listed policy name, in registration order."""
    return tuple(name for name in _FACTORIES if name not in _UNLISTED)


def is_balance_route(name: str) -> bool:
    """Whether `name` is of the BalanceRoute family (takes a `BalanceRouteConfig`)."""
    return name in _BALANCE_ROUTE


def make_policy(
    name: str,
    *,
    seed: int = 0,
    config: BalanceRouteConfig | None = None,
    predictor: Predictor | None = None,
) -> Policy:
    """Build a policy by name. `brh-NAME` builds BR-H with a fresh predictor `NAME` unless
    one is passed (a predictor shared with the replay engine or mirror learns from it)."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(policy_names())}")
    return factory(seed=seed, config=config, predictor=predictor)
