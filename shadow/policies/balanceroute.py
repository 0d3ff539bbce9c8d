"""BR-0 and BR-H: route by the barrier cost, with the two-stage admission round of
BALANCEROUTE.md (greedy while many slots are free, exact subset choice when few are).

Both policies share the round; they differ only in the load picture the round scores
against: BR-0 the current loads, BR-H a projection of every worker's load over the next
`H + 1` steps from the predicted survival of its active requests.
"""

from __future__ import annotations

import numpy as np

from shadow.policies.balanceroute_config import BalanceRouteConfig
from shadow.policies.base import Policy
from shadow.policies.fscore import PiecewiseObjective, discounts
from shadow.policies.poolscan import SortedPool
from shadow.policies.registry import PolicyFactory, register_policy
from shadow.policies.snapshot import ActiveSet, Admission, FleetSnapshot, ReadyPool
from shadow.policies.subset import best_subset
from shadow.predict.predictors import PREDICTORS, Predictor, make_predictor


class _CurrentLoads:
    """BR-0's load picture: the loads now; one margin per worker."""

    def __init__(self, load: np.ndarray) -> None:
        self.current = load.astype(np.float64)
        self._top = float(self.current.max())
        self._workers = load.shape[0]

    def objective(self, g: int) -> PiecewiseObjective:
        return PiecewiseObjective.br0(self._top - float(self.current[g]), self._workers)

    def safe_margins(self) -> np.ndarray:
        return self._top - self.current

    def add(self, g: int, tokens: int) -> None:
        self.current[g] += tokens
        self._top = max(self._top, float(self.current[g]))


def project_loads(
    load: np.ndarray, active: ActiveSet, contribution: np.ndarray, horizon: int
) -> np.ndarray:
    """`Lhat[g, h] = sum over active i on g of 1[h < c_i] * (s_i + a_i + h)`, h = 0..H.

    A request with contribution `c` is alive at offsets `0..ceil(c)-1`; counting where
    each request stops (a bincount) and subtracting running totals from the current
    load and count gives every worker's projection without a loop over requests.
    """
    workers = load.shape[0]
    width = horizon + 2
    # (ufuncs in place rather than np.clip and two cumsums: BR-H projects in every round
    # of a replay, where these arrays are small and the calls' overhead is the cost)
    stop = np.ceil(contribution)
    np.maximum(stop, 0, out=stop)
    np.minimum(stop, horizon + 1, out=stop)
    cell = active.worker * width + stop.astype(np.int64)
    base = (active.prompt_tokens + active.generated).astype(np.float64)
    stopped = np.empty((2, workers, width))
    stopped[0].flat = np.bincount(cell, weights=base, minlength=workers * width)
    stopped[1].flat = np.bincount(cell, minlength=workers * width)
    np.cumsum(stopped, axis=2, out=stopped)
    stopped_tokens = stopped[0, :, : horizon + 1]
    stopped_count = stopped[1, :, : horizon + 1]
    count = np.bincount(active.worker, minlength=workers).astype(np.float64)
    offsets = np.arange(horizon + 1, dtype=np.float64)
    alive_tokens = load.astype(np.float64)[:, None] - stopped_tokens
    alive_count = count[:, None] - stopped_count
    return alive_tokens + offsets * alive_count


def horizon_scores(projection: np.ndarray, config: BalanceRouteConfig, added: float) -> np.ndarray:
    """`F_g({request})` in BR-H form for every worker, from a projection (see
    `BalanceRouteHorizon.project`): the decision audit's yardstick."""
    horizon = config.horizon
    workers = projection.shape[0]
    margins = projection.max(axis=0)[None, :] - projection
    alpha, beta = config.coefficients(workers)
    discount = discounts(horizon, config.gamma)
    penalty = (np.maximum(0.0, added - margins) * discount).sum(axis=1)
    return alpha * discount.sum() * added - beta * penalty


class _ProjectedLoads:
    """BR-H's load picture: the projection, its envelope and discounted margins."""

    def __init__(
        self,
        load: np.ndarray,
        projection: np.ndarray,
        discount: np.ndarray,
        alpha: float,
        beta: float,
    ) -> None:
        self.current = load.astype(np.float64)
        self._projection = projection
        self._envelope = projection.max(axis=0)
        self._discount = discount
        self._alpha = alpha
        self._beta = beta

    def objective(self, g: int) -> PiecewiseObjective:
        return PiecewiseObjective(
            self._envelope - self._projection[g], self._discount, self._alpha, self._beta
        )

    def safe_margins(self) -> np.ndarray:
        """(choice) The tokens a worker can take at no penalty anywhere in the horizon."""
        return (self._envelope - self._projection).min(axis=1)

    def add(self, g: int, tokens: int) -> None:
        self.current[g] += tokens
        row = self._projection[g]
        row += tokens
        np.maximum(self._envelope, row, out=self._envelope)


def two_stage_admission(
    picture: _CurrentLoads | _ProjectedLoads,
    free: np.ndarray,
    prompts: np.ndarray,
    config: BalanceRouteConfig,
) -> list[tuple[int, int]]:
    """The admission round; returns `(pool position, worker index)` in decision order."""
    free = free.astype(np.int64)
    pool_size = prompts.shape[0]
    taken = np.zeros(pool_size, dtype=bool)
    decided: list[tuple[int, int]] = []
    slots = int(free.sum())
    worker_index = np.arange(free.shape[0])

    # Stage 1: while many slots are free, the emptiest worker takes its best single request
    # (the most free slots, then the lowest load, then the lowest index: what
    # `np.lexsort((worker_index, picture.current, -free))[0]` picks, without a sort).
    # The pool sorted for the scan is built at Stage 1's first scored choice: most rounds
    # of a filled fleet have fewer free slots than `s_greedy`, or one request, which
    # goes in unscored, and sorting the pool was a visible part of such a round.
    sorted_pool: SortedPool | None = None
    while slots > config.s_greedy and len(decided) < pool_size:
        most_free = (free == free.max()).nonzero()[0]
        g = int(most_free[picture.current[most_free].argmin()])
        if len(decided) == pool_size - 1:  # one request left: it is the best, unscored
            i = int(np.flatnonzero(~taken)[0])
        else:
            if sorted_pool is None:  # before any take: the first choice of a pool of 2+
                sorted_pool = SortedPool(prompts)
            i = sorted_pool.best(picture.objective(g))
        taken[i] = True
        if sorted_pool is not None:
            sorted_pool.take(i)
        picture.add(g, int(prompts[i]))
        free[g] -= 1
        slots -= 1
        decided.append((i, g))

    # Stage 2: the worker with the largest safe margin takes the best subset of the first
    # R_max requests in pool order; a best F <= 0 still admits one (starvation guard).
    # the first R_max untaken requests in pool order; the rest join from `untaken` as
    # these are taken (listing the rest of the pool again after each choice was O(pool))
    untaken = np.flatnonzero(~taken)
    queue = untaken[: config.r_max].tolist()
    cursor = len(queue)
    while queue and slots > 0:
        open_workers = np.flatnonzero(free > 0)
        if open_workers.shape[0] == 1:
            # the only worker with a free slot is the lexsort's first for any margin that
            # is a number (a full fleet's round after one completion: most rounds at 1.0)
            g = int(open_workers[0])
        else:
            margins = np.where(free > 0, picture.safe_margins(), -np.inf)
            g = int(np.lexsort((worker_index, -free, -margins))[0])
        candidates = queue
        if len(candidates) == 1:
            # One candidate goes in either way, by the best subset or by the starvation
            # guard: no objective to build (the decision audit's every round, and the
            # last of most rounds).
            positions: tuple[int, ...] = (0,)
        else:
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
        queue = [i for i in queue if i not in chosen]
        if len(queue) < config.r_max and cursor < untaken.shape[0]:
            joining = config.r_max - len(queue)
            queue += untaken[cursor : cursor + joining].tolist()
            cursor += joining
    return decided


def _as_admissions(
    decided: list[tuple[int, int]], snapshot: FleetSnapshot, pool: ReadyPool
) -> list[Admission]:
    return [Admission(pool.request_ids[i], snapshot.worker_ids[g]) for i, g in decided]


class BalanceRouteZero(Policy):
    """BR-0: minimise the current step's barrier gap."""

    name = "br0"
    reads_active = False

    def __init__(self, config: BalanceRouteConfig | None = None, seed: int = 0) -> None:
        base = config or BalanceRouteConfig()
        self.config = BalanceRouteConfig(horizon=0, s_greedy=base.s_greedy, r_max=base.r_max)

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        if not len(pool):
            return []
        picture = _CurrentLoads(snapshot.load)
        decided = two_stage_admission(picture, snapshot.free_slots, pool.prompt_tokens, self.config)
        return _as_admissions(decided, snapshot, pool)


class BalanceRouteHorizon(Policy):
    """BR-H: minimise the discounted gap over the next `H + 1` projected steps."""

    name = "brh"

    def __init__(
        self, predictor: Predictor, config: BalanceRouteConfig | None = None, seed: int = 0
    ) -> None:
        self.config = config or BalanceRouteConfig()
        self.predictor = predictor

    def project(self, snapshot: FleetSnapshot) -> np.ndarray:
        """The projected loads `Lhat[g, h]` this policy would route against."""
        horizon = self.config.horizon
        contribution = self.predictor.predict(snapshot.active, horizon).contribution
        return project_loads(snapshot.load, snapshot.active, contribution, horizon)

    def admit(
        self, snapshot: FleetSnapshot, pool: ReadyPool, projection: np.ndarray | None = None
    ) -> list[Admission]:
        """One round; pass `projection` to reuse one already made for this snapshot."""
        if not len(pool):
            return []
        horizon = self.config.horizon
        projection = self.project(snapshot) if projection is None else projection.copy()
        alpha, beta = self.config.coefficients(snapshot.workers)
        picture = _ProjectedLoads(
            snapshot.load, projection, discounts(horizon, self.config.gamma), alpha, beta
        )
        decided = two_stage_admission(picture, snapshot.free_slots, pool.prompt_tokens, self.config)
        return _as_admissions(decided, snapshot, pool)


@register_policy("br0", balance_route=True)
def _balance_route_zero(
    *, seed: int, config: BalanceRouteConfig | None, predictor: Predictor | None
) -> Policy:
    return BalanceRouteZero(config, seed=seed)


def _balance_route_horizon(predictor_name: str | None) -> PolicyFactory:
    """The factory of `brh-NAME`: BR-H with a fresh predictor NAME unless one is passed;
    bare `brh` (None) takes only a passed one."""

    def build(
        *, seed: int, config: BalanceRouteConfig | None, predictor: Predictor | None
    ) -> Policy:
        if predictor is None:
            if predictor_name is None:
                raise ValueError("policy 'brh' needs a predictor; name it as brh-survival, ...")
            predictor = make_predictor(predictor_name)
        elif predictor_name is not None and predictor.name != predictor_name:
            raise ValueError(
                f"policy 'brh-{predictor_name}' was given a {predictor.name!r} predictor"
            )
        return BalanceRouteHorizon(predictor, config, seed=seed)

    return build


register_policy("brh", listed=False, balance_route=True)(_balance_route_horizon(None))
for _predictor in PREDICTORS:
    register_policy(f"brh-{_predictor}", balance_route=True)(_balance_route_horizon(_predictor))
