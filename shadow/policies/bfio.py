"""BF-IO (`bf-io`) and its current-load form (`bf-io-h0`): the BalanceRoute group's
earlier algorithm (Chen et al., "A Universal Load Balancing Principle and Its Application
to LLM Serving", arXiv 2601.17855), read from their public simulator
(Echoscd/Load-Balancing-Release, `simlib/strategies/strategy_balance_future*.py`).

What sets it apart from BR-0/BR-H, and why it is a peer worth replaying beside them:

- the overflow penalty has a fixed weight (`weight`, their 43) instead of `G`;
- the horizon keeps a surviving request at its current length (it drops out when its
  remaining steps run out) instead of growing it by a token a step;
- Stage 1 scores every visible candidate, not only the head of the pool, and Stage 2
  searches subsets of every visible candidate: for each subset size from the worker's
  free slots down to 1, the largest reachable sum within the worker's safe margin
  (`m`, its smallest margin over the horizon), else the smallest above it; the best `F`
  over sizes wins, stopping at the first size that fits within the margin;
- Stage 2 serves workers lowest projected load first (at the end of the horizon).

Rule and choices: docs/POLICIES.md.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from shadow.policies.base import Policy
from shadow.policies.fscore import PiecewiseObjective, discounts
from shadow.policies.registry import register_policy
from shadow.policies.snapshot import ActiveSet, Admission, FleetSnapshot, ReadyPool

#: Their horizon cap (`HORIZON_MAX`), their overflow weight and decay.
BF_IO_HORIZON = 72
BF_IO_WEIGHT = 43.0
BF_IO_DECAY = 0.86
#: Free slots above which Stage 1 (greedy, one request at a time) runs.
BF_IO_GREEDY_SLOTS = 7
#: Visible candidates per worker: their simulator reveals 4 requests per worker (its
#: `reveal_target`), so its rounds see that many; our pool is taken oldest first.
BF_IO_VISIBLE_PER_WORKER = 4


def survival_projection(
    load: np.ndarray, active: ActiveSet, remaining: np.ndarray, horizon: int
) -> np.ndarray:
    """`P[g, t]` for t = 0..T: the load of `g` if no request grows and each leaves when its
    remaining steps run out (`remaining <= t`); column 0 is the current load."""
    workers = load.shape[0]
    width = horizon + 2
    leaves = np.clip(remaining, 0, horizon + 1).astype(np.int64)
    tokens = (active.prompt_tokens + active.generated).astype(np.float64)
    gone = np.bincount(active.worker * width + leaves, weights=tokens, minlength=workers * width)
    gone = np.cumsum(gone.reshape(workers, width), axis=1)[:, : horizon + 1]
    gone[:, 0] = 0.0  # the current load counts every active request
    return load.astype(np.float64)[:, None] - gone


class _Layers:
    """Sums reachable with exactly `j` of the candidates, kept per prefix so one subset
    can be recovered; sums above `cap` are dropped (only the smallest above the margin
    matters, and past `cap` that is the sum of the `j` smallest, handled by the caller)."""

    def __init__(self, sizes: list[int], max_items: int, cap: int) -> None:
        mask = (1 << (cap + 1)) - 1
        width = min(max_items, len(sizes))
        layer = [1] + [0] * width
        self.prefixes = [layer]
        for size in sizes:
            nxt = layer[:]
            for j in range(width, 0, -1):
                nxt[j] = (nxt[j] | (layer[j - 1] << size)) & mask
            self.prefixes.append(nxt)
            layer = nxt
        self.sizes = sizes

    def final(self, count: int) -> int:
        return self.prefixes[-1][count]

    def recover(self, count: int, total: int) -> list[int]:
        """Positions of `count` candidates summing to `total`, older ones preferred."""
        chosen: list[int] = []
        for i in range(len(self.sizes), 0, -1):
            if count == 0:
                break
            if (self.prefixes[i - 1][count] >> total) & 1:
                continue  # reachable without candidate i-1
            chosen.append(i - 1)
            total -= self.sizes[i - 1]
            count -= 1
        if total != 0 or count != 0:
            raise AssertionError("bf-io subset recovery failed")
        return chosen[::-1]


def best_subset_by_margin(
    sizes: list[int], slots: int, objective: PiecewiseObjective, margin: int
) -> tuple[list[int], float]:
    """BF-IO's Stage 2 choice for one worker: positions into `sizes` and their `F`."""
    cap = max(margin, 0) + max(sizes)
    layers = _Layers(sizes, slots, cap)
    smallest = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    best: tuple[list[int], float, int] | None = None
    for count in range(min(slots, len(sizes)), 0, -1):
        bits = layers.final(count)
        within = bits & ((1 << (margin + 1)) - 1) if margin >= 1 else 0
        if within:
            total = within.bit_length() - 1
            positions = layers.recover(count, total)
        else:
            above = bits >> (margin + 1) if margin >= 0 else bits
            if above:
                total = max(margin + 1, 0) + (above & -above).bit_length() - 1
                positions = layers.recover(count, total)
            else:  # every sum of `count` candidates is past the cap: the smallest ones
                positions = sorted(smallest[:count])
                total = sum(sizes[i] for i in positions)
        score = objective.value(total)
        if best is None or score > best[1]:
            best = (positions, score, total)
            if total <= margin:
                break
    assert best is not None
    return best[0], best[1]


class BalanceFutureIO(Policy):
    """BF-IO's admission round (`horizon = 0`: `bf-io-h0`). The horizon reads the true
    remaining length of each active request where the snapshot carries it (replay), as
    their simulator reads its `o_est`; without it every request survives the horizon."""

    def __init__(self, horizon: int, seed: int = 0, weight: float = BF_IO_WEIGHT) -> None:
        if horizon < 0 or weight < 0:
            raise ValueError(f"bf-io needs horizon >= 0 and weight >= 0, got {horizon}, {weight}")
        self.horizon = horizon
        self.weight = weight
        self.name = "bf-io" if horizon else "bf-io-h0"  # type: ignore[misc]

    def project(self, snapshot: FleetSnapshot) -> np.ndarray:
        active = snapshot.active
        if self.horizon == 0 or not len(active):
            return snapshot.load.astype(np.float64)[:, None]
        remaining = active.remaining
        if remaining is None:
            remaining = np.full(len(active), self.horizon + 1, dtype=np.int64)
        horizon = min(self.horizon, max(1, int(remaining.max())))
        return survival_projection(snapshot.load, active, remaining, horizon)

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        free = snapshot.free_slots.astype(np.int64)
        if not len(pool) or not free.sum():
            return []
        projection = self.project(snapshot)
        envelope = projection.max(axis=0)
        discount = discounts(projection.shape[1] - 1, BF_IO_DECAY)
        prompts = pool.prompt_tokens.tolist()
        visible = BF_IO_VISIBLE_PER_WORKER * snapshot.workers
        queue = list(range(len(pool)))
        decided: list[tuple[int, int]] = []

        def objective(g: int) -> PiecewiseObjective:
            margins = np.maximum(envelope - projection[g], 0.0)
            return PiecewiseObjective(margins, discount, 1.0, self.weight)

        def add(g: int, positions: list[int]) -> None:
            nonlocal envelope
            for position in positions:
                decided.append((queue[position], g))
            projection[g] += sum(prompts[queue[p]] for p in positions)
            envelope = np.maximum(envelope, projection[g])
            free[g] -= len(positions)
            chosen = set(positions)
            queue[:] = [i for p, i in enumerate(queue) if p not in chosen]

        # Stage 1: the worker with the most free slots (ties: lowest current load) takes
        # the visible candidate with the highest F (prompts of 0 tokens only if no other).
        while queue and int(free.sum()) > BF_IO_GREEDY_SLOTS:
            most = np.flatnonzero(free == free.max())
            g = int(most[np.argmin(projection[most, 0])])
            sizes = np.array([prompts[i] for i in queue[:visible]], dtype=np.float64)
            scores = objective(g).values(sizes)
            if (sizes > 0).any():
                scores = np.where(sizes > 0, scores, -np.inf)
            add(g, [int(np.argmax(scores))])

        # Stage 2: workers lowest projected load at the end of the horizon first, each
        # taking its best subset of the visible candidates (at least one request).
        heap = [(float(projection[g, -1]), g) for g in np.flatnonzero(free > 0).tolist()]
        heapq.heapify(heap)
        while heap and queue:
            _, g = heapq.heappop(heap)
            sizes = [prompts[i] for i in queue[:visible]]
            score = objective(g)
            margin = math.floor(float(np.maximum(envelope - projection[g], 0.0).min()))
            positions, best = best_subset_by_margin(sizes, int(free[g]), score, margin)
            if best <= 0.0:
                singles = score.values(np.array(sizes, dtype=np.float64))
                positions = [int(np.argmax(singles))]
            add(g, positions)
            if free[g] > 0:
                heapq.heappush(heap, (float(projection[g, -1]), g))
        return [Admission(pool.request_ids[i], snapshot.worker_ids[g]) for i, g in decided]


@register_policy("bf-io-h0")
def _bf_io_h0(*, seed: int, config: object, predictor: object) -> Policy:
    return BalanceFutureIO(0, seed=seed)


@register_policy("bf-io")
def _bf_io(*, seed: int, config: object, predictor: object) -> Policy:
    return BalanceFutureIO(BF_IO_HORIZON, seed=seed)
