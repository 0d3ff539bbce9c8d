"""How far each source of a fleet has got in event time, so that the reorder window does
not release a fleet's events past a source that is still sending them.

The window holds events for `reorder_window_s` behind the newest one seen. That is enough
while every source posts at its own pace, and not when one source's events come in a burst
ahead of another's. After a stall of the service or of the host, the posts that queued are
taken in any order: when the engines' plugin's backlog comes first, its steps are applied
before the tap's dispatches and finishes of the same seconds, which then come late. For
those seconds the mirror counts fewer (or more) requests than the engine ran, and the
drift check reports it as drift; the audit sees the same wrong fleet.

So each fleet is released up to its slowest *sending* source's time, less the window, not
up to its newest event's. A source can have nothing to send (a tap with no traffic, a
source that posts once), so it holds its fleet back only while it is live:

- for at most `wait_s` of wall time after its last post. That time counts only while the
  service takes posts: a gap in ingest longer than `gap_s` starts every source's wait
  again, since a stalled source looks just like a quiet one until its backlog comes;
- and not when it is more than `max_lag_s` of event time behind its fleet's newest event
  (a clock that far off is not one to wait for).

A fleet with no live source is released as before source clocks: up to the newest event
of any fleet, less the window, so one gone quiet beside a busy one is not held for good.

Pure bookkeeping: the pipeline passes the times in (`now`, monotonic seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class _Source:
    clock: float
    last_post: float


class SourceClocks:
    def __init__(
        self, window_s: float, wait_s: float, max_lag_s: float, gap_s: float = 1.0
    ) -> None:
        self.window_s = window_s
        self.wait_s = wait_s
        self.max_lag_s = max_lag_s
        self.gap_s = gap_s
        #: fleet -> source -> where it got to
        self._fleets: dict[str, dict[str, _Source]] = {}
        self._last_batch = -math.inf
        #: when ingest went on after its last gap (every source's wait starts there)
        self._resumed = -math.inf

    def batch(self, now: float) -> None:
        """A batch came in at `now`."""
        if now - self._last_batch > self.gap_s:
            self._resumed = now
        self._last_batch = now

    def saw(self, fleet: str, source: str, ts: float, now: float) -> None:
        """`source` posted events of `fleet` up to `ts` at `now`."""
        sources = self._fleets.get(fleet)
        if sources is None:
            sources = self._fleets[fleet] = {}
        known = sources.get(source)
        if known is None:
            sources[source] = _Source(ts, now)
        else:
            known.clock = max(known.clock, ts)
            known.last_post = now

    def release_points(self, now: float, window_s: float | None = None) -> dict[str, float]:
        """Per fleet, the time up to which its events can be applied, less the window
        (`window_s`, default the reorder window's): its slowest live source's time; for a
        fleet with no live source, the newest event of any fleet (the rule before: time
        moving on elsewhere releases a fleet gone quiet, as it does with `wait_s` 0)."""
        window_s = self.window_s if window_s is None else window_s
        fleets = self._fleets
        newest = {f: max(s.clock for s in sources.values()) for f, sources in fleets.items()}
        everywhere = max(newest.values(), default=-math.inf)
        points: dict[str, float] = {}
        for fleet, sources in fleets.items():
            floor = newest[fleet] - self.max_lag_s
            slowest = math.inf
            gone = []
            for name, source in sources.items():
                live = now - max(source.last_post, self._resumed) < self.wait_s
                if live and floor <= source.clock < slowest:
                    slowest = source.clock
                elif not live and source.clock < floor:
                    gone.append(name)  # a source that stopped (a restarted plugin's old name)
            for name in gone:
                del sources[name]
            points[fleet] = (everywhere if slowest == math.inf else slowest) - window_s
        return points

    def sources(self, fleet: str) -> list[str]:
        """The sources of `fleet` it keeps (those that posted lately or are not far behind)."""
        return list(self._fleets.get(fleet, ()))

    def newest(self) -> dict[str, float]:
        """Per fleet, its newest event's time (where the buffer's bound releases to)."""
        return {f: max(s.clock for s in sources.values()) for f, sources in self._fleets.items()}
