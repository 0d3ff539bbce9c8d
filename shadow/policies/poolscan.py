"""Stage 1's best single request, found without scoring the whole ready pool.

Stage 1 asks, once per admitted request, which request of the pool scores the highest `F`
on one worker; scoring all 4,096 of a G = 256 pool 250 times a round was most of a BR-H
round. `F` is concave in the prompt size `D` (BALANCEROUTE.md), so in a pool sorted by
size it rises up to its peak and falls after it: a scan that starts at the peak and widens
until the score at each edge is below the best found can stop long before the ends.

It must choose what the full scan's `argmax` chooses, bit for bit, ties and rounding
included. The scores it computes are the full scan's own (the same `values` call on the
same sizes), and it stops at an edge only when that edge's score is below the best by more
than twice `PiecewiseObjective.rounding_bound`: then the exact `F` there is below the exact
`F` of the best, so by concavity every request beyond that edge has an exact `F` no higher
than the edge's, and a rounded score below the best. Among the scores equal to the best it
takes the first pool position, as `argmax` does.
"""

from __future__ import annotations

import math

import numpy as np

from shadow.policies.fscore import PiecewiseObjective

#: requests scored on each side of the peak before the scan widens (doubling)
FIRST_REACH = 8


class SortedPool:
    """One round's ready pool: the requests not yet taken, sorted by prompt size."""

    def __init__(self, prompts: np.ndarray) -> None:
        prompts = np.asarray(prompts)
        # a stable sort: equal sizes stay in pool order, and a request's rank in it locates
        # the request when it is taken
        order = np.argsort(prompts, kind="stable")
        self._rank = np.empty_like(order)
        self._rank[order] = np.arange(order.shape[0])
        #: the untaken requests' sizes, and a table of their pool positions and ranks, in
        #: size order; the first `_count` are live (a take shifts the rest left)
        self._sizes = prompts[order]
        self._table = np.stack([order, np.arange(order.shape[0])])
        self._count = order.shape[0]
        self._largest = float(np.abs(prompts).max()) if prompts.shape[0] else 0.0

    def take(self, position: int) -> None:
        """Remove the request at pool `position` (admitted) from the choice."""
        ranks = self._table[1, : self._count]
        at = int(ranks.searchsorted(self._rank[position]))
        if at == self._count or ranks[at] != self._rank[position]:
            raise ValueError(f"pool position {position} is taken already")
        self._sizes[at : self._count - 1] = self._sizes[at + 1 : self._count]
        self._table[:, at : self._count - 1] = self._table[:, at + 1 : self._count]
        self._count -= 1

    def best(self, objective: PiecewiseObjective) -> int:
        """The pool position of the untaken request with the highest `F`, the first pool
        position among equal scores: `argmax` of the full scan with taken ones at -inf."""
        count = self._count
        if not count:
            raise ValueError("every request of the pool is taken: nothing to choose")
        tolerance = 2.0 * objective.rounding_bound(self._largest)
        if not math.isfinite(tolerance):  # not concave (or not finite): score them all
            return self._best_in(objective, 0, count)[0]
        peak = int(self._sizes[:count].searchsorted(objective.peak(), side="left"))
        left = right = FIRST_REACH
        while True:
            lo, hi = max(0, peak - left), min(count, peak + right)
            position, scores = self._best_in(objective, lo, hi)
            top = scores.max()
            widen_left = lo > 0 and not scores[0] + tolerance < top
            widen_right = hi < count and not scores[-1] + tolerance < top
            if not (widen_left or widen_right):
                return position
            left, right = left * (2 if widen_left else 1), right * (2 if widen_right else 1)

    def _best_in(self, objective: PiecewiseObjective, lo: int, hi: int) -> tuple[int, np.ndarray]:
        """The best of the untaken requests `lo..hi-1` (in size order), and their scores."""
        scores = objective.values(self._sizes[lo:hi])
        top = scores.max()
        hit = scores == top if top == top else np.isnan(scores)  # argmax takes a NaN first
        tied = self._table[0, lo:hi][hit]
        return int(tied.min()), scores
