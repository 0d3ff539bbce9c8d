"""The reorder buffer: events waiting for their turn in event time.

Entries are `(ts, class order, ingest_id, event)`; the class order is
`shadow.events.EVENT_ORDER`, so entries at equal times release in the stream's order.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Mapping
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
        #: per fleet, its stragglers (a heap): each fleet is released up to its own time
        self._late: dict[str, list[Entry]] = {}
        #: every entry so far was pushed in ingest-id order (the ingest path's, which
        #: numbers events as it pushes them): then a run's ids rise along it too
        self._ids_in_push_order = True
        self._last_pushed_id = -math.inf

    def __len__(self) -> int:
        return sum(map(len, self._runs.values())) + sum(map(len, self._late.values()))

    def push(self, entry: Entry) -> None:
        if entry[2] < self._last_pushed_id:
            self._ids_in_push_order = False
        self._last_pushed_id = entry[2]
        fleet = entry[3].fleet
        run = self._runs.get(fleet)
        if run is None:
            run = self._runs[fleet] = []
        if not run or entry > run[-1]:
            run.append(entry)
        else:
            heapq.heappush(self._late.setdefault(fleet, []), entry)

    def pop_until(self, upto: float | Mapping[str, float]) -> list[Entry]:
        """Remove and return, in order, every entry with a time up to `upto`: one time for
        every fleet, or each fleet's own (a fleet it does not name keeps its entries)."""
        released: list[Entry] = []
        each = upto if isinstance(upto, Mapping) else None
        for fleet, run in self._runs.items():
            limit = upto if each is None else each.get(fleet, -math.inf)
            if run and run[0][0] <= limit:
                cut = (limit, math.inf)  # after every entry at `limit`, before any later one
                end = bisect_right(run, cut)
                released += run[:end]
                del run[:end]
        for fleet, late in self._late.items():
            limit = upto if each is None else each.get(fleet, -math.inf)
            while late and late[0][0] <= limit:
                released.append(heapq.heappop(late))
        released.sort()
        return released

    def lowest_id(self) -> int | None:
        """The lowest ingest id held. With ids pushed in order, each run's first entry
        has its lowest: no scan of the ~2 s of events the buffer holds (at G = 256 that
        scan after every batch was 5% of the ingest thread)."""
        if self._ids_in_push_order:
            ids = [run[0][2] for run in self._runs.values() if run]
        else:
            ids = [min(map(_INGEST_ID, run)) for run in self._runs.values() if run]
        ids += [min(map(_INGEST_ID, late)) for late in self._late.values() if late]
        return min(ids) if ids else None
