"""The progress de-duplication memory: the highest cumulative count received per request.

A progress event is a duplicate when it is not ahead of what was received for its request
(`Pipeline._is_new`). The memory must outlive the request by `finished_ttl_s`, so that a
late resend of its progress is not stored again. While the request lives its count is
kept here, by (fleet, request id); once its finish is applied the count moves into the
mirror's `FinishedRequest`, which is kept exactly that long anyway (`FleetMirror.
forget_finished`): a fleet finishing hundreds of requests a second then holds no second
copy of each finished request's id and key here, nor a queue entry to forget it by.
A finish the mirror did not take (an unknown or stale request) keeps its count here and
forgets it `finished_ttl_s` after the finish, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from shadow.stream.mirror import FinishedRequest, FleetMirror

#: (fleet, request id)
Key = tuple[str, str]


class _HasMirror(Protocol):
    mirror: FleetMirror


class ProgressSeen:
    """Highest progress count received per request, live ones here, finished ones in the
    fleet's mirror (`fleets`: the pipeline's fleet states, read when a key is not here)."""

    def __init__(self, fleets: Mapping[str, _HasMirror]) -> None:
        self._fleets = fleets
        #: live requests (and finishes the mirror did not take), by key
        self.live: dict[Key, int] = {}
        #: (finish time, key) of the finishes the mirror did not take, oldest first
        self._unmoved: deque[tuple[float, Key]] = deque()

    def _finished(self, key: Key) -> FinishedRequest | None:
        state = self._fleets.get(key[0])
        if state is None:
            return None
        request = state.mirror.requests.get(key[1])
        return request if isinstance(request, FinishedRequest) else None

    def get(self, key: Key) -> int:
        """The highest count received for the request; -1: none (or forgotten)."""
        seen = self.live.get(key)
        if seen is not None:
            return seen
        done = self._finished(key)
        return done.progress_seen if done is not None else -1

    def raise_to(self, key: Key, generated: int) -> bool:
        """Take `generated` if it is ahead of what was received; whether it was."""
        live = self.live
        seen = live.get(key)
        if seen is not None:
            if generated > seen:
                live[key] = generated
                return True
            return False
        done = self._finished(key)
        if done is not None:
            if generated > done.progress_seen:
                done.progress_seen = generated
                return True
            return False
        if generated > -1:
            live[key] = generated
            return True
        return False

    def restore(self, key: Key, generated: int) -> None:
        """A stored count at a restart (the last one stored wins, as when it came)."""
        done = self._finished(key) if key not in self.live else None
        if done is not None:
            done.progress_seen = generated
        else:
            self.live[key] = generated

    def finished(self, key: Key, ts: float) -> None:
        """A finish of the request was applied: its count moves into the mirror's record
        of it, or, if the mirror holds none, is forgotten `finished_ttl_s` after `ts`."""
        seen = self.live.get(key)
        if seen is None:
            return
        done = self._finished(key)
        if done is not None:
            del self.live[key]
            done.progress_seen = max(done.progress_seen, seen)
        else:
            self._unmoved.append((ts, key))

    def forget(self, horizon: float) -> None:
        """Forget the counts kept here of finishes before `horizon` (the mirror forgets
        its finished requests, and their counts, by itself)."""
        unmoved, live = self._unmoved, self.live
        while unmoved and unmoved[0][0] < horizon:
            live.pop(unmoved.popleft()[1], None)

    def __len__(self) -> int:
        return len(self.live)
