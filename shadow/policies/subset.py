"""Exact subset choice for Stage 2 of the admission round.

`F` depends on a candidate set only through its token sum `D`, so the search runs over
reachable sums, not subsets: a bitset per subset size (`dp[j] |= dp[j-1] << s_i`, Python
ints as bitsets) gives every sum reachable with at most `k` requests, and concavity of `F`
means the best reachable sum is one of the two adjacent to the unconstrained maximiser.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shadow.policies.fscore import PiecewiseObjective


@dataclass(frozen=True, slots=True)
class SubsetChoice:
    """Positions (into the candidate list) of the chosen requests, their token sum and `F`."""

    positions: tuple[int, ...]
    added: int
    score: float


def reachable_layers(sizes: Sequence[int], max_items: int) -> list[list[int]]:
    """`layers[i][j]`: bitset of sums reachable with exactly `j` of the first `i` sizes."""
    width = min(max_items, len(sizes))
    layer = [1] + [0] * width
    layers = [layer]
    for size in sizes:
        nxt = layer[:]
        for j in range(width, 0, -1):
            nxt[j] |= layer[j - 1] << size
        layers.append(nxt)
        layer = nxt
    return layers


def reachable_sums(sizes: Sequence[int], max_items: int) -> int:
    """Bitset of every sum of a non-empty subset with at most `max_items` elements."""
    last = reachable_layers(sizes, max_items)[-1]
    bits = 0
    for mask in last[1:]:
        bits |= mask
    return bits


def _nearest_below(bits: int, limit: float) -> int | None:
    """Largest set bit <= limit."""
    if limit < 0:
        return None
    if limit >= bits.bit_length():
        return bits.bit_length() - 1 if bits else None
    cap = math.floor(limit)
    below = bits & ((1 << (cap + 1)) - 1)
    return below.bit_length() - 1 if below else None


def _nearest_above(bits: int, limit: float) -> int | None:
    """Smallest set bit >= limit."""
    start = max(0, math.ceil(limit)) if limit != math.inf else bits.bit_length()
    above = bits >> start
    if not above:
        return None
    return start + (above & -above).bit_length() - 1


def best_reachable_sum(objective: PiecewiseObjective, bits: int) -> tuple[int, float]:
    """The reachable sum with the highest `F` (ties: the smaller sum), by concavity."""
    peak = objective.peak()
    best: tuple[int, float] | None = None
    for candidate in (_nearest_below(bits, peak), _nearest_above(bits, peak)):
        if candidate is None:
            continue
        score = objective.value(candidate)
        if best is None or score > best[1] or (score == best[1] and candidate < best[0]):
            best = (candidate, score)
    if best is None:
        raise ValueError("no reachable sum: the candidate list is empty")
    return best


def _recover(layers: list[list[int]], sizes: Sequence[int], added: int) -> tuple[int, ...]:
    """One subset summing to `added`, fewest requests first, earlier requests preferred."""
    width = len(layers[0]) - 1
    count = next(j for j in range(1, width + 1) if (layers[-1][j] >> added) & 1)
    chosen: list[int] = []
    remaining = added
    for i in range(len(sizes), 0, -1):
        if (layers[i - 1][count] >> remaining) & 1:
            continue  # reachable without request i-1: skip it, keep the older ones
        chosen.append(i - 1)
        remaining -= sizes[i - 1]
        count -= 1
    if remaining != 0 or count != 0:
        raise AssertionError("subset recovery failed; reachable-sum layers are inconsistent")
    return tuple(reversed(chosen))


def best_subset(
    objective: PiecewiseObjective, sizes: Sequence[int], max_items: int
) -> SubsetChoice:
    """The non-empty subset of `sizes` with at most `max_items` elements maximising `F`."""
    if not sizes or max_items < 1:
        raise ValueError("best_subset needs at least one candidate and one free slot")
    sizes = [int(s) for s in sizes]
    if max_items == 1:
        return best_single(objective, sizes)
    return _best_by_sums(objective, sizes, max_items)


def _best_by_sums(objective: PiecewiseObjective, sizes: list[int], max_items: int) -> SubsetChoice:
    """The bitset search over reachable sums, then the subset behind the best one."""
    layers = reachable_layers(sizes, max_items)
    bits = 0
    for mask in layers[-1][1:]:
        bits |= mask
    added, score = best_reachable_sum(objective, bits)
    return SubsetChoice(_recover(layers, sizes, added), added, score)


def best_single(objective: PiecewiseObjective, sizes: list[int]) -> SubsetChoice:
    """`best_subset` with one free slot, the round of a full fleet after one completion
    (most rounds of a replay at load 1.0): the reachable sums are the sizes themselves,
    so the bitset search and its recovery come down to the nearest size at or below the
    peak and at or above it. The same choice: the higher `F`, ties to the smaller sum,
    then to the earliest request."""
    peak = objective.peak()
    if math.isnan(peak) or peak == -math.inf or min(sizes) < 0:
        # no policy makes these (margins are finite, prompts >= 0); the bitset search
        # raises on them, and a guarded policy's error must stay an error
        return _best_by_sums(objective, sizes, 1)
    below = max((size for size in sizes if size <= peak), default=None) if peak >= 0 else None
    above = min((size for size in sizes if size >= peak), default=None)
    best: tuple[int, float] | None = None
    for candidate in (below, above):
        if candidate is None:
            continue
        score = objective.value(candidate)
        if best is None or score > best[1] or (score == best[1] and candidate < best[0]):
            best = (candidate, score)
    if best is None:  # unreachable: a non-empty list has a size on one side of a number
        raise ValueError("no size on either side of the peak")
    return SubsetChoice((sizes.index(best[0]),), best[0], best[1])
