"""A worker's recent active counts, so a scrape is compared with the right moment.

A `/metrics` page shows the engine at one moment between the scrape's request and its
answer, and on a busy host that span is seconds: comparing the page with the mirror at
either end sees the requests dispatched or finished in between as drift. The mirror
records each change of a worker's active count here; the drift check takes the lowest
and highest count over the scrape's span, and drift is a count outside that range.
"""

from __future__ import annotations

from collections import deque

#: changes kept per worker: a scrape span with more changes than this is not judged
HISTORY_CHANGES = 64


class ActiveHistory:
    """The last `HISTORY_CHANGES` changes of one worker's active count, as
    (event time, count before, count after)."""

    __slots__ = ("_changes",)

    def __init__(self) -> None:
        self._changes: deque[tuple[float, int, int]] = deque(maxlen=HISTORY_CHANGES)

    def record(self, ts: float, before: int, after: int) -> None:
        self._changes.append((ts, before, after))

    def between(self, start: float, end: float, current: int) -> tuple[int, int] | None:
        """(lowest, highest) active count over [start, end]; `current` is the count now.

        None when the kept changes do not reach back to `start` (more changes in the span
        than are kept): the range is then unknown, and nothing should be concluded."""
        changes = self._changes
        if not changes:
            return current, current
        if changes[0][0] > start and len(changes) == changes.maxlen:
            return None
        at_start = None
        low = high = None
        for ts, before, after in changes:
            if ts <= start:
                at_start = after
            elif ts <= end:
                if at_start is None:
                    at_start = before
                low = after if low is None else min(low, after)
                high = after if high is None else max(high, after)
        if at_start is None:  # every kept change is after `end`: the first says what was
            at_start = next(before for ts, before, _ in changes if ts > end)
        low = at_start if low is None else min(low, at_start)
        high = at_start if high is None else max(high, at_start)
        return low, high
