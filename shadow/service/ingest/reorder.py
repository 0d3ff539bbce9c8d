"""The reorder buffer: events waiting for their turn in event time.

Entries are `(ts, class order, ingest_id, event)`; the class order is
`shadow.events.EVENT_ORDER`, so entries at equal times release in the stream's order.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from operator import itemgetter
from typing import Any

Entry = tuple[float, int, int, Any]
_INGEST_ID = itemgetter(2)


class ReorderBuffer:
    """Events waiting for their turn, released in `(ts, class order, ingest_id)` order.

    Each fleet's stream is nearly always in order, while fleets interleave: an entry that
    sorts after its fleet's last one is appended to that fleet's run (sorted), a
    straggler goes to a heap. A release cuts each run at `upto` (a bisection), takes
    the heap's entries up to it and sorts the lot once: a merge of a few sorted runs,
    in C. (One run for all fleets sent most entries of interleaved fleets to the heap:
    two log-n heap operations each.)
    Entries compare whole: ingest ids are unique, so a comparison never reaches the event.
    """

    def __init__(self) -> None:
        self._runs: dict[str, list[Entry]] = {}
        self._late: list[Entry] = []

    def __len__(self) -> int:
        return sum(map(len, self._runs.values())) + len(self._late)

    def push(self, entry: Entry) -> None:
        fleet = entry[3].fleet
        run = self._runs.get(fleet)
        if run is None:
            run = self._runs[fleet] = []
        if not run or entry > run[-1]:
            run.append(entry)
        else:
            heapq.heappush(self._late, entry)

    def pop_until(self, upto: float) -> list[Entry]:
        """Remove and return, in order, every entry with a time up to `upto`."""
        released: list[Entry] = []
        cut = (upto, math.inf)  # after every entry at `upto`, before any later one
        for run in self._runs.values():
            if run and run[0][0] <= upto:
                end = bisect_right(run, cut)
                released += run[:end]
                del run[:end]
        late = self._late
        while late and late[0][0] <= upto:
            released.append(heapq.heappop(late))
        released.sort()
        return released

    def lowest_id(self) -> int | None:
        ids = [min(map(_INGEST_ID, run)) for run in self._runs.values() if run]
        if self._late:
            ids.append(min(map(_INGEST_ID, self._late)))
        return min(ids) if ids else None
