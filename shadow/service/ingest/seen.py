"""Which integers a counting source has sent: the dedupe memory of seqs and step numbers.

Sources count up, so the memory keeps the highest value and the gaps below it, as
disjoint half-open intervals, rather than every value. In order, a value costs one
comparison; a batch that overtakes another leaves one interval, which the late batch then
fills from its low end (one update a value). A jump of a million (a source restarted at a
higher count) is one interval too, where a set of the missing values would hold a million
ints and re-scan them on every later jump.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import pairwise


class RecentInts:
    """Integers seen, exact within `window` of the highest; older ones count as seen."""

    __slots__ = ("_ends", "_starts", "high", "restored_high", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.high = -1
        #: gaps below `high`: [starts[i], ends[i]), sorted and disjoint
        self._starts: list[int] = []
        self._ends: list[int] = []
        #: the highest value before a restart (`seed`); -1 without one
        self.restored_high = -1

    def add(self, value: int) -> bool:
        """Record `value`; False when it was seen (or is too old to tell, so presumed)."""
        high = self.high
        if value == high + 1:
            self.high = value
            return True
        if value > high:
            floor = max(high + 1, value - self.window)
            self._starts.append(floor)
            self._ends.append(value)
            self.high = value
            self._forget_below(value - self.window)
            return True
        starts = self._starts
        index = bisect_right(starts, value) - 1
        if index < 0 or value >= self._ends[index]:
            return False
        start, end = starts[index], self._ends[index]
        if value == start:  # the usual case: a late batch, in order
            if start + 1 == end:
                del starts[index], self._ends[index]
            else:
                starts[index] = start + 1
        elif value + 1 == end:
            self._ends[index] = value
        else:  # a hole in the middle: split the interval
            self._ends[index] = value
            starts.insert(index + 1, value + 1)
            self._ends.insert(index + 1, end)
        return True

    def _forget_below(self, floor: int) -> None:
        """Drop gaps wholly older than the window (the memory stays O(gaps in it))."""
        starts, ends = self._starts, self._ends
        drop = 0
        while drop < len(ends) and ends[drop] <= floor:
            drop += 1
        if drop:
            del starts[:drop], ends[:drop]
        if starts and starts[0] < floor:
            starts[0] = floor

    def gaps(self) -> int:
        """How many values below the highest are still missing."""
        return sum(end - start for start, end in zip(self._starts, self._ends, strict=True))

    def seed(self, values: set[int]) -> None:
        """Restore from stored values: everything below the lowest counts as seen."""
        if not values:
            return
        ordered = sorted(values)
        self._starts, self._ends = [], []
        for before, after in pairwise(ordered):
            if after > before + 1:
                self._starts.append(before + 1)
                self._ends.append(after)
        self.high = ordered[-1]
        self.restored_high = self.high
