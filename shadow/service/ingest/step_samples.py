"""The fleet's recent worker steps for the step-model fit, kept cheap on both ends.

Each engine step appends one (step, kv, ms, ts) row; each refit (once per due window)
needs them as an array. Converting all 50,000 rows on every refit cost ~30 ms of the
ingest thread a window; here a refit converts only the rows added since the previous one
and keeps the last `limit`, the very array converting them all would give.
"""

from __future__ import annotations

from collections import deque

import numpy as np

#: one row: (engine step number, kv tokens, duration ms, end ts)
StepRow = tuple[int, int, float, float]


class StepSamples:
    """The last `limit` worker steps: `append` per step, `array` per refit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: rows since the last `array` (bounded: with no refit, only the last `limit` count)
        self._new: deque[StepRow] = deque(maxlen=limit)
        self._array = np.empty((0, 4), dtype=np.float64)
        #: the ingest path's per-step call, without a method frame of this class
        self.append = self._new.append

    def __len__(self) -> int:
        return min(self.limit, self._array.shape[0] + len(self._new))

    def array(self) -> np.ndarray:
        """The last `limit` rows, oldest first, as float64 columns (step, kv, ms, ts)."""
        if self._new:
            fresh = np.array(self._new, dtype=np.float64)
            self._new.clear()
            if fresh.shape[0] >= self.limit:
                self._array = fresh[-self.limit :]
            else:
                self._array = np.concatenate([self._array, fresh])[-self.limit :]
            self._array.flags.writeable = False  # the caller's view of what is kept
        return self._array
