"""The mirror's ready pool as columns in ready order, kept beside its dict of requests.

The audit runs the policies' round on the whole pool at every new incumbent round. Built
from the dict, a round walked every pooled request in Python five times (the list, two
columns, the ids, the round's id set), so its cost grew with the pool: at G = 256 and
load 1.0 the recorded incumbent's backlog grows without end, and the audit worker's CPU
doubled over ten minutes at a constant event rate. Kept as columns, a round is a mask and
three gathers in NumPy. The mirror makes them on first use (`FleetMirror.ready`), so only
the audit's replica keeps them; the ingest path's mirror does not.

A request leaves the pool by a tombstone (`RequestState.pool_index` says where it is);
the columns are compacted when the dead outnumber the live, so each removal costs O(1)
amortized and the columns hold at most twice the pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shadow.stream.mirror_records import RequestState

#: the columns' first size; they double as the pool grows
INITIAL_ROWS = 256
#: the per-row columns, grown and compacted together
COLUMNS = ("_requests", "_ids", "_prompts", "_keys", "_alive", "_seqs")


class ReadyColumns:
    """Request ids, prompt tokens and prompt keys of the pool, oldest first."""

    __slots__ = (
        "_alive", "_dead", "_end", "_ids", "_keys", "_next_seq", "_prompts", "_requests", "_seqs",
    )  # fmt: skip

    def __init__(self) -> None:
        self._requests = np.empty(INITIAL_ROWS, dtype=object)
        self._ids = np.empty(INITIAL_ROWS, dtype=object)
        self._prompts = np.zeros(INITIAL_ROWS, dtype=np.int64)
        self._keys = np.zeros(INITIAL_ROWS, dtype=np.int64)
        self._alive = np.zeros(INITIAL_ROWS, dtype=bool)
        #: each row's place in the order of additions (kept across compactions)
        self._seqs = np.zeros(INITIAL_ROWS, dtype=np.int64)
        self._next_seq = 0
        self._end = 0  # rows written
        self._dead = 0  # rows written and since removed

    def __len__(self) -> int:
        return self._end - self._dead

    @property
    def next_seq(self) -> int:
        """The sequence number the next addition gets: read at a round's start, it tells
        the requests pooled before it (`added_before`) from those pooled since."""
        return self._next_seq

    def added_before(self, request: RequestState, seq: int) -> bool:
        """Whether `request` is in the pool and was added before sequence number `seq`."""
        row = request.pool_index
        return row >= 0 and int(self._seqs[row]) < seq

    def add(self, request: RequestState) -> None:
        """Append `request` (ready, or back from its worker) as the newest."""
        if self._end == self._alive.shape[0]:
            self._grow()
        row = self._end
        self._requests[row] = request
        self._ids[row] = request.request_id
        self._prompts[row] = request.prompt_tokens
        self._keys[row] = request.prompt_key
        self._alive[row] = True
        self._seqs[row] = self._next_seq
        self._next_seq += 1
        request.pool_index = row
        self._end = row + 1

    def remove(self, request: RequestState) -> None:
        """Take `request` out (dispatched or finished from the pool); not pooled: nothing."""
        row = request.pool_index
        if row < 0:
            return
        request.pool_index = -1
        self._alive[row] = False
        self._requests[row] = None
        self._ids[row] = None
        self._dead += 1
        if self._dead > max(INITIAL_ROWS, self._end - self._dead):
            self._compact()

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request ids, prompt tokens, prompt keys) of the pool in ready order: copies,
        so a later change of the pool does not reach a round that holds them."""
        end = self._end
        if not self._dead:
            return self._ids[:end].copy(), self._prompts[:end].copy(), self._keys[:end].copy()
        alive = self._alive[:end]
        return self._ids[:end][alive], self._prompts[:end][alive], self._keys[:end][alive]

    def _grow(self) -> None:
        rows = 2 * self._alive.shape[0]
        for name in COLUMNS:
            column = getattr(self, name)
            grown = np.zeros(rows, dtype=column.dtype)
            grown[: column.shape[0]] = column
            setattr(self, name, grown)

    def _compact(self) -> None:
        """Drop the tombstones and renumber the live requests' rows (in Python, once per
        as many removals as there are live rows)."""
        end = self._end
        alive = self._alive[:end]
        live = int(alive.sum())
        rows = max(INITIAL_ROWS, 2 * live)
        for name in COLUMNS:
            column = getattr(self, name)
            kept = np.zeros(rows, dtype=column.dtype)
            kept[:live] = column[:end][alive]
            setattr(self, name, kept)
        for row, request in enumerate(self._requests[:live].tolist()):
            request.pool_index = row
        self._end, self._dead = live, 0
