"""The join of two finishes of one request: the tap's and the engine's own.

The tap counts tokens from the stream (exact from usage, else an estimate: a lower
bound); vLLM's stat-logger plugin sends the engine's exact count (`from_engine`). Both
finishes of a request meet here, in stream order:

- whichever comes first finishes the request (releases its slot);
- a later exact count for a request finished with an estimate corrects it (the mirror's
  completed record; the caller corrects what it stored);
- a later estimate, or any later finish of a request finished exactly, is ignored;
- an engine finish for a request the shadow never saw is `unjoined`, never a violation:
  the engine also serves requests that did not pass the tap. It is held (the latest
  `EARLY_MAX`) in case the tap's events of that request come later than the reorder
  window (the plugin's batch can overtake the tap's): the tap's finish then finishes the
  request and the held count joins it as a later exact one would;
- with n > 1 the tap names the children `<id>#<k>` while the engine reports `<id>` for
  each: an engine finish for `<id>` goes to the first child (by finish time, then index)
  still without an exact count;
- `recomputed` is no finish: the request goes back to the pool (`apply_recompute`).

Pure: the counters are plain integers the service exports on `/metrics`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from shadow.events.schema import FINISH_REASONS
from shadow.stream.mirror import FleetMirror
from shadow.stream.mirror_records import Completed, RequestState

#: the separator of an n > 1 child's choice index (`<external id>#<k>`)
CHILD_SEPARATOR = "#"
RECOMPUTED = "recomputed"
#: the `reason` label of a reason outside FINISH_REASONS (labels stay bounded)
OTHER_REASON = "other"
#: engine finishes of requests not seen yet, held for a late tap (the latest so many:
#: ~1 s of finishes at G = 256; older ones stay unjoined)
EARLY_MAX = 4096

#: outcomes of one finish event
FINISHED, CORRECTED, IGNORED, UNJOINED, RECOMPUTE, UNKNOWN = (
    "finished", "corrected", "ignored", "unjoined", "recomputed", "unknown",
)  # fmt: skip


@dataclass(frozen=True)
class FinishOutcome:
    """What one finish event did. `request_id` is the request it joined (a child's id
    for an engine finish of an n > 1 request); `primary_ref` the reference of the finish
    that finished it, for a later one (`corrected`, `ignored`), else -1."""

    kind: str
    request_id: str
    completed: Completed | None = None
    primary_ref: int = -1
    #: for a tap finish that met a held engine finish: that finish's reference (-1: none)
    early_ref: int = -1
    #: and whether its exact count corrected the tap's estimate
    early_corrected: bool = False


def reason_label(reason: str) -> str:
    """The `reason` label of `shadow_finish_reasons_total`: known reasons as they are,
    any other `other`."""
    return reason if reason in FINISH_REASONS else OTHER_REASON


class FinishJoin:
    """The join state of one fleet: n > 1 children by parent id, and the counters."""

    def __init__(self) -> None:
        #: parent external id -> its children's ids (`<id>#<k>`), as the tap named them
        self.children: dict[str, list[str]] = {}
        #: finishes that finished a request with the tap's estimate
        self.estimates = 0
        #: of those, estimates an exact count later replaced
        self.corrections = 0
        #: engine finishes for requests the shadow never saw
        self.unjoined = 0
        #: reason label -> finishes (and recomputes) applied with it
        self.reasons: Counter[str] = Counter()
        #: engine request id -> held (output_tokens, ref) of its finishes not joined yet
        self.early: OrderedDict[str, list[tuple[int, int]]] = OrderedDict()
        self._early_count = 0

    def hold_early(self, request_id: str, output_tokens: int, ref: int) -> None:
        """Keep an engine finish of a request not seen yet (the oldest go past EARLY_MAX)."""
        self.early.setdefault(request_id, []).append((output_tokens, ref))
        self._early_count += 1
        while self._early_count > EARLY_MAX:
            _, dropped = self.early.popitem(last=False)
            self._early_count -= len(dropped)

    def take_early(self, request_id: str) -> tuple[int, int] | None:
        """A held engine finish for the tap's `request_id` (an n > 1 child's, under its
        parent's id), or None."""
        for key in (request_id, request_id.rpartition(CHILD_SEPARATOR)[0]):
            held = self.early.get(key) if key else None
            if held:
                found = held.pop(0)
                self._early_count -= 1
                if not held:
                    del self.early[key]
                return found
        return None

    def note_request(self, request_id: str) -> None:
        """Remember an n > 1 child under its parent id (called on ready and dispatch)."""
        parent, sep, index = request_id.rpartition(CHILD_SEPARATOR)
        if sep and parent and index.isdigit():
            kids = self.children.setdefault(parent, [])
            if request_id not in kids:
                kids.append(request_id)

    def forget(self, mirror: FleetMirror) -> None:
        """Drop the parents whose children the mirror forgot."""
        known = mirror.requests
        gone = [p for p, kids in self.children.items() if not any(k in known for k in kids)]
        for parent in gone:
            del self.children[parent]

    def target(self, mirror: FleetMirror, request_id: str, from_engine: bool) -> str | None:
        """The request an event's `request_id` means: itself when known (or for a tap
        event); for an engine finish of an n > 1 parent, its first child (by finish time,
        then index) still without an exact count, else its first child (a duplicate).
        None: a request the shadow never saw."""
        if request_id in mirror.requests or not from_engine:
            return request_id
        kids = [k for k in self.children.get(request_id, ()) if k in mirror.requests]
        if not kids:
            return None
        open_kids = []
        for kid in kids:
            request = mirror.requests[kid]
            if request.finished and not request.estimated:
                continue
            when = request.finish_ts if request.finished else None
            when = float("inf") if when is None else when
            open_kids.append((when, int(kid.rpartition(CHILD_SEPARATOR)[2]), kid))
        return min(open_kids)[2] if open_kids else kids[0]

    def later_finish(
        self, mirror: FleetMirror, request: RequestState, output_tokens: int, exact: bool
    ) -> FinishOutcome:
        """A finish for a request already finished: a correction or nothing."""
        if request.estimated and exact:
            self.corrections += 1
            done = mirror.correct(request, output_tokens)
            return FinishOutcome(CORRECTED, request.request_id, done, request.finish_ref)
        return FinishOutcome(IGNORED, request.request_id, None, request.finish_ref)
