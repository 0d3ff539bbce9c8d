"""Policies that break one gate rule each, for the tests that make every rule fail on
real evidence. Named in a service's `policy_modules` setting, they are registered in its
worker processes too (the audit and the window replays run there)."""

from __future__ import annotations

import gc
import time

import numpy as np

from shadow.policies import BalanceRouteHorizon, FleetSnapshot, ReadyPool, register_policy
from shadow.policies.baselines import JoinShortestQueuePolicy
from shadow.policies.snapshot import ActiveSet
from shadow.predict import Prediction, SurvivalPredictor

#: the CPU time the slow policy spends on a round: past the latency rule's 5 ms cap
SLOW_ROUND_S = 0.006
#: the raising policy fails every round whose pool holds a prompt length divisible by this
RAISE_EVERY = 11


@register_policy("slow-jsq")
class SlowJoinShortestQueue(JoinShortestQueuePolicy):
    """JSQ's decisions, each round computing `SLOW_ROUND_S` longer (busy: the audit
    times a round's CPU, as a policy is pure computation)."""

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool):
        until = time.thread_time() + SLOW_ROUND_S
        while time.thread_time() < until:
            pass
        return super().admit(snapshot, pool)


@register_policy("collected-jsq")
class CollectedJoinShortestQueue(JoinShortestQueuePolicy):
    """JSQ, with a full garbage collection inside each round, as one due at the round's
    allocations would run there: the audit process's cost, which the audit leaves out."""

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool):
        gc.collect()
        return super().admit(snapshot, pool)


class PromptLengthBug(ValueError):
    pass


@register_policy("raising-jsq")
class RaisingJoinShortestQueue(JoinShortestQueuePolicy):
    """JSQ, except that a round with a prompt length divisible by `RAISE_EVERY` raises."""

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool):
        if len(pool) and bool((np.asarray(pool.prompt_tokens) % RAISE_EVERY == 0).any()):
            raise PromptLengthBug("a prompt length this policy cannot handle")
        return super().admit(snapshot, pool)


class ContrarianPredictor(SurvivalPredictor):
    """Survival's expected contribution, but P(finish within H) turned upside down: what
    routes like BR-H-survival, with a finish probability that ranks requests backwards."""

    name = "contrarian"

    def predict(self, active: ActiveSet, horizon: int) -> Prediction:
        honest = super().predict(active, horizon)
        return Prediction(honest.contribution, 1.0 - honest.finish_probability)


@register_policy("brh-contrarian", balance_route=True)
def _contrarian(*, seed, config, predictor):
    return BalanceRouteHorizon(predictor or ContrarianPredictor(), config, seed=seed)
