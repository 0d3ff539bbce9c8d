"""Gap and F-score arithmetic of BalanceRoute (BALANCEROUTE.md), public so that the
decision audit can score any choice, not only the policy's own.

`F` is what admitting `D` prompt tokens to one worker does to the barrier gap `I(k)`:
BR-0 scores the current step exactly, BR-H a discounted horizon of projected steps.
"""

from __future__ import annotations

import math

import numpy as np


def gap(loads: np.ndarray) -> float:
    """`I(k) = G * max_g L_g - sum_g L_g`: tokens needed to lift every worker to the highest."""
    loads = np.asarray(loads)
    return float(loads.shape[0] * loads.max() - loads.sum())


def imbalance(loads: np.ndarray) -> float:
    """`max_g L_g - min_g L_g`."""
    loads = np.asarray(loads)
    return float(loads.max() - loads.min())


def safe_margins(loads: np.ndarray) -> np.ndarray:
    """`m_g = max L - L_g`: tokens worker `g` can take before it raises the barrier."""
    loads = np.asarray(loads)
    return loads.max() - loads


def f_score_br0(added: float, margin: float, workers: int) -> float:
    """BR-0: `F = D - G * max(0, D - m_g)`, exactly the reduction of the gap."""
    return added - workers * max(0.0, added - margin)


def gap_reduction(loads: np.ndarray, worker: int, added: float) -> float:
    """Gap before minus gap after adding `added` tokens to `worker` (the ground truth F models)."""
    after = np.array(loads, dtype=np.float64)
    after[worker] += added
    return gap(loads) - gap(after)


def discounts(horizon: int, gamma: float) -> np.ndarray:
    """`d_h = gamma**h` for `h = 0..H`."""
    return gamma ** np.arange(horizon + 1, dtype=np.float64)


def f_score_brh(
    added: float, margins: np.ndarray, discount: np.ndarray, alpha: float, beta: float
) -> float:
    """BR-H: `alpha * sum(d) * D - beta * sum_h d_h * max(0, D - m_{g,h})` (direct, O(H))."""
    margins = np.asarray(margins, dtype=np.float64)
    penalty = np.maximum(0.0, added - margins)
    return float(alpha * discount.sum() * added - beta * (discount * penalty).sum())


#: BR-0's one discount and its prefix sums (shared: an objective never writes them)
_ONE_WEIGHT = np.ones(1)
_ONE_PREFIX = np.array([0.0, 1.0])
_ONE_WEIGHT.setflags(write=False)
_ONE_PREFIX.setflags(write=False)


class PiecewiseObjective:
    """`F_g(D)` of one worker, prepared for many evaluations within one admission round.

    `F` is concave and piecewise linear in `D` with kinks at the margins. Sorting the
    margins once and keeping prefix sums of the discounts (and of discount x margin)
    makes one evaluation a binary search, and the unconstrained maximiser `D*` is the
    first kink after which the slope is no longer positive.
    """

    __slots__ = ("_beta", "_gain", "_kinks", "_prefix_d", "_prefix_dm", "_weights")

    def __init__(self, margins: np.ndarray, discount: np.ndarray, alpha: float, beta: float):
        margins = np.asarray(margins, dtype=np.float64)
        # (array methods, not np.* wrappers: Stage 1 builds one of these per choice)
        order = margins.argsort(kind="stable")
        kinks = margins[order]
        weights = discount[order]
        self._kinks = kinks
        self._weights = weights
        self._prefix_d = np.concatenate(([0.0], weights.cumsum()))
        self._prefix_dm = np.concatenate(([0.0], (weights * kinks).cumsum()))
        self._gain = alpha * float(self._prefix_d[-1])
        self._beta = float(beta)

    @classmethod
    def br0(cls, margin: float, workers: int) -> PiecewiseObjective:
        """BR-0's objective: one kink at the margin, slope 1 before it and `1 - G` after.

        Built directly, not through `__init__`: BR-0 makes one in every Stage 2 choice,
        and sorting and summing one kink cost more than the choice itself. The arrays are
        the ones `__init__` computes (1.0 x margin is the margin exactly)."""
        objective = cls.__new__(cls)
        kinks = np.array([margin], dtype=np.float64)
        objective._kinks = kinks
        objective._weights = _ONE_WEIGHT
        objective._prefix_d = _ONE_PREFIX
        objective._prefix_dm = np.array([0.0, kinks[0]])
        objective._gain = 1.0
        objective._beta = float(workers)
        return objective

    def value(self, added: float) -> float:
        k = int(self._kinks.searchsorted(added, side="left"))  # (the method: no wrapper)
        return self._gain * added - self._beta * (
            added * float(self._prefix_d[k]) - float(self._prefix_dm[k])
        )

    def values(self, added: np.ndarray) -> np.ndarray:
        added = np.asarray(added, dtype=np.float64)
        k = self._kinks.searchsorted(added, side="left")
        return self._gain * added - self._beta * (added * self._prefix_d[k] - self._prefix_dm[k])

    def rounding_bound(self, largest: float) -> float:
        """How far `values(D)`, for any `|D| <= largest`, can be from `F(D)` computed in
        exact arithmetic from the same margins, discounts and coefficients (`inf` where
        `F` is not concave, i.e. a negative discount or `beta`).

        `values` rounds a cumulative sum of at most `n` weights (and of weight x margin
        products) and five operations after it: standard bounds give at most
        `~(n + 5) * 2**-53` of the terms' magnitudes; four times that leaves room for the
        second-order terms. Stage 1's pool scan needs it to stop early and stay exact.
        """
        n = self._kinks.shape[0]
        if self._beta < 0.0 or (n and float(self._weights.min()) < 0.0):
            return math.inf
        weight = float(self._prefix_d[-1])  # the rounded sum: the factor 4 covers its error
        spread = max(abs(float(self._kinks[0])), abs(float(self._kinks[-1]))) if n else 0.0
        magnitude = abs(self._gain) * largest + self._beta * weight * (largest + spread)
        return 4.0 * (n + 8) * 2.0**-53 * magnitude

    def peak(self) -> float:
        """The unconstrained maximiser `D*` (`inf` when `F` never stops rising)."""
        # The slope after kink k is gain - beta * prefix_d[k + 1]; prefix_d only grows.
        if self._beta <= 0.0:
            return math.inf
        k = int(self._prefix_d[1:].searchsorted(self._gain / self._beta, side="left"))
        return float(self._kinks[k]) if k < self._kinks.shape[0] else math.inf
