"""What the window tracker (`shadow.stream.windows`) holds while windows wait: each
window's start state, arrivals and steps, and each request they hold until every one of
them is evaluated, about a request's life after the window ends. At G = 256 that is some
six windows and ~100,000 requests, so the records are slotted and the start state columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from shadow.stream.window_metrics import SealedSteps


@dataclass(slots=True)
class TrackedRequest:
    """A request the tracker holds until every window it is in is evaluated (~100,000
    at a time at G = 256: slots, not a dict each)."""

    prompt: int
    key: int
    ready_ts: float | None = None
    dispatch_ts: float | None = None
    finish_ts: float | None = None
    output: int | None = None
    progress: int = 0
    #: the windows that hold it, as bits over window indexes from `first_window` (bit 0
    #: always set while any holds it): it is forgotten when none does, and its finish tells
    #: each of them one request fewer is unfinished. A list here cost ~110 bytes a request;
    #: a mask of a few windows is a small int, which Python does not even allocate.
    first_window: int = 0
    held: int = 0

    def hold(self, index: int) -> bool:
        """Held by window `index` too; False when that window held it already."""
        if not self.held:
            self.first_window, self.held = index, 1
            return True
        if index < self.first_window:
            self.held <<= self.first_window - index
            self.first_window = index
        bit = 1 << (index - self.first_window)
        if self.held & bit:
            return False
        self.held |= bit
        return True

    def release(self, index: int) -> bool:
        """Window `index` holds it no more; whether any window still does."""
        offset = index - self.first_window
        if offset >= 0 and self.held >> offset & 1:
            self.held &= ~(1 << offset)
            if self.held:
                # keep bit 0 the first holding window: the mask stays a small number
                low = (self.held & -self.held).bit_length() - 1
                self.held >>= low
                self.first_window += low
        return bool(self.held)

    def held_by(self) -> Iterator[int]:
        """The indexes of the windows that hold it."""
        mask, index = self.held, self.first_window
        while mask:
            if mask & 1:
                yield index
            mask >>= 1
            index += 1


@dataclass(slots=True)
class RunningAtStart:
    """The requests running at a window's start, as columns: a window waits about a
    request's life for them to finish, so at G = 256 some six windows each hold ~32,000
    (as a tuple and a boxed count each, ~3 MiB a window)."""

    ids: list[str]
    worker: np.ndarray  # int32: the worker's index in the window's fleet
    generated: np.ndarray  # int64: tokens it had generated at the start

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[tuple[str, int, int]]:
        return zip(self.ids, self.worker.tolist(), self.generated.tolist(), strict=True)


@dataclass
class TrackedWindow:
    index: int
    t_start: float
    workers: tuple[str, ...]
    batch: int
    initial: RunningAtStart
    pool: list[str]
    arrivals: list[str] = field(default_factory=list)
    t_end: float | None = None
    #: slots per worker at the start (0: draining)
    capacity: tuple[int, ...] = ()
    #: (worker index, its own step number) -> (start s, duration ms, kv tokens, running)
    steps: dict[tuple[int, int], tuple[float, float, int, int]] = field(default_factory=dict)
    #: `steps` as columns once none can come (two windows later), `steps` then emptied
    sealed: SealedSteps | None = None
    history: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    history_keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    #: dispatches that landed exactly on a step boundary, and those in the middle of a step
    on_boundary: int = 0
    mid_step: int = 0
    #: closed at the end of a recorded log: the evidence's last window
    final: bool = False
    #: its requests (counted once per time it holds one) with no finish yet: `due` asks
    #: this on every batch, where rescanning every request of every waiting window cost
    #: the ingest path more than applying the events
    unfinished: int = 0
    #: found not `blank` while open (`WindowTracker.before_event` asked it on every event)
    used: bool = False

    def request_ids(self) -> list[str]:
        return self.initial.ids + self.pool + self.arrivals

    def holds_requests(self) -> bool:
        return bool(self.initial or self.pool or self.arrivals)

    def blank(self) -> bool:
        """No request, no step and no dispatch in it yet."""
        return not (self.initial or self.pool or self.arrivals or self.steps) and not (
            self.on_boundary or self.mid_step
        )
