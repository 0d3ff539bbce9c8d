"""Finished requests in columns: what the mirror remembers of a request that left the
fleet, until `FleetMirror.forget_finished`.

A fleet finishing hundreds of requests a second holds `finished_ttl_s` (300 s) of them:
at G = 256, ~165,000 requests in the ingest process and as many in the audit replica. As
objects (a `__slots__` record, its dict entry, the id string and the boxed numbers) that
was ~400 bytes a request, 13 MiB a minute per process until the first ones were forgotten.
Here a request is a row of fixed-width columns in chunks, found by the 64-bit hash of its
id, and no Python object per request: ~51 bytes a request with 100,000 held (the counts
in 32 bits, the reason a one-byte code into the reasons seen; a count past 32 bits, which
the event schema allows, or a reason past the 254 codes is kept beside its row,
flagged). With every column 64-bit and the reason an object pointer it was ~74.

The id itself is not kept, so the finished requests cannot be listed, only looked up;
nothing needs to list them. Two ids with the same 64-bit hash would be taken for one
request: with Python's keyed string hash and ~2 x 10^5 requests held, a new id has about
one chance in 10^14 of meeting a held one.

A lookup returns a `FinishedRequest`, a view of the row that reads (and, for the fields
that change after the finish, writes) the columns. A view is valid until the next
`forget`, which may drop its chunk: callers use it at once, as they did the record.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shadow.stream.mirror_records import RequestState

#: rows per chunk: a chunk is dropped whole once all its rows are forgotten
CHUNK_ROWS = 4096
#: columns of `_Chunk.keys` (64-bit) and of `_Chunk.counts` (32-bit)
_PROMPT_KEY, _FINISH_REF = range(2)
_PROMPT_TOKENS, _OUTPUT_TOKENS, _PROGRESS_SEEN = range(3)
#: bits of `_Chunk.flags` (`_WIDE`: the row's counts are in `FinishedLedger._wide`)
_ESTIMATED, _NO_FINISH_TS, _NO_OUTPUT, _FORGOTTEN, _WIDE = 1, 2, 4, 8, 16
#: reason codes: 0 is None, 1.._REASON_CODES - 1 index the reasons seen, `_OWN_REASON`
#: keeps the row's reason in `FinishedLedger._own_reasons`. Codes are never freed: past
#: 254 distinct reasons in a ledger's life (vLLM sends a handful), each new one is kept so
_REASON_CODES = 255
_OWN_REASON = 255
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class _Chunk:
    """`CHUNK_ROWS` rows in the order they were added."""

    __slots__ = ("counts", "flags", "keys", "left_ts", "reasons", "size", "unforgotten_min")

    def __init__(self) -> None:
        self.left_ts = np.empty(CHUNK_ROWS, dtype=np.float64)
        self.keys = np.empty((CHUNK_ROWS, 2), dtype=np.int64)
        self.counts = np.empty((CHUNK_ROWS, 3), dtype=np.int32)
        self.reasons = np.zeros(CHUNK_ROWS, dtype=np.uint8)
        self.flags = np.zeros(CHUNK_ROWS, dtype=np.uint8)
        self.size = 0
        #: the earliest `left_ts` of its rows not yet forgotten (inf: none)
        self.unforgotten_min = float("inf")


class FinishedRequest:
    """A request that left the fleet (finished, or released as a ghost), as the mirror
    remembers it: what tells a late duplicate of its events from new ones and lets a later
    exact count correct an estimate (`FleetMirror.correct`). Read like a `RequestState`
    (`finished`, no `worker`); a view of its row in the `FinishedLedger`."""

    __slots__ = ("_ledger", "_row", "request_id")

    finished = True
    worker = None
    dispatch_ts = None
    slot = -1

    def __init__(self, ledger: FinishedLedger, row: int, request_id: str) -> None:
        self._ledger = ledger
        self._row = row
        self.request_id = request_id

    def _at(self) -> tuple[_Chunk, int]:
        return self._ledger._locate(self._row)

    def _count(self, column: int) -> int:
        chunk, i = self._at()
        if chunk.flags[i] & _WIDE:
            return self._ledger._wide[self._row][column]
        return int(chunk.counts[i, column])

    def _set_count(self, column: int, value: int) -> None:
        chunk, i = self._at()
        self._ledger._set_count(chunk, i, self._row, column, value)

    def _flag(self, bit: int) -> bool:
        chunk, i = self._at()
        return bool(chunk.flags[i] & bit)

    @property
    def left_ts(self) -> float:
        """When it left the fleet (its finish, or the ghost sweep): what it is forgotten by."""
        chunk, i = self._at()
        return float(chunk.left_ts[i])

    @property
    def finish_ts(self) -> float | None:
        """Its finish's time; None for a ghost (it never finished)."""
        return None if self._flag(_NO_FINISH_TS) else self.left_ts

    @property
    def prompt_tokens(self) -> int:
        return self._count(_PROMPT_TOKENS)

    @property
    def prompt_key(self) -> int:
        chunk, i = self._at()
        return int(chunk.keys[i, _PROMPT_KEY])

    @property
    def finish_ref(self) -> int:
        """The caller's reference to the finish that finished it (the ingest id)."""
        chunk, i = self._at()
        return int(chunk.keys[i, _FINISH_REF])

    @property
    def reason(self) -> str | None:
        chunk, i = self._at()
        code = int(chunk.reasons[i])
        if code == _OWN_REASON:
            return self._ledger._own_reasons[self._row]
        return self._ledger._reason_names[code]

    @property
    def output_tokens(self) -> int | None:
        return None if self._flag(_NO_OUTPUT) else self._count(_OUTPUT_TOKENS)

    @output_tokens.setter
    def output_tokens(self, value: int) -> None:
        self._set_count(_OUTPUT_TOKENS, value)
        chunk, i = self._at()
        chunk.flags[i] &= ~np.uint8(_NO_OUTPUT)

    @property
    def estimated(self) -> bool:
        """Its count is the tap's estimate (a lower bound), not the engine's."""
        return self._flag(_ESTIMATED)

    @estimated.setter
    def estimated(self, value: bool) -> None:
        chunk, i = self._at()
        if value:
            chunk.flags[i] |= np.uint8(_ESTIMATED)
        else:
            chunk.flags[i] &= ~np.uint8(_ESTIMATED)

    @property
    def progress_seen(self) -> int:
        """The highest progress count the ingest received for it, kept with it for its
        de-duplication (`service.ingest.progress_seen`); -1: none."""
        return self._count(_PROGRESS_SEEN)

    @progress_seen.setter
    def progress_seen(self, value: int) -> None:
        self._set_count(_PROGRESS_SEEN, value)


class FinishedLedger:
    """The finished requests of one mirror, found by id until forgotten."""

    def __init__(self) -> None:
        self._chunks: deque[_Chunk] = deque([_Chunk()])
        #: row number of the first chunk's first row (rows are numbered as added)
        self._first_row = 0
        self._next_row = 0
        #: hash -> row of the rows of the last chunk (the one being filled)
        self._open: dict[int, int] = {}
        #: hash and row (less `_rows_base`) of the full chunks' rows, by hash (equal
        #: hashes: oldest first)
        self._hashes = np.empty(0, dtype=np.int64)
        self._rows = np.empty(0, dtype=np.int32)
        self._rows_base = 0
        self._held = 0
        #: reason code -> reason (code 0: None), and reason -> code
        self._reason_names: list[str | None] = [None]
        self._reason_codes: dict[str, int] = {}
        #: row -> its reason, for rows coded `_OWN_REASON`; row -> its counts, for `_WIDE`
        self._own_reasons: dict[int, str] = {}
        self._wide: dict[int, list[int]] = {}

    def __len__(self) -> int:
        """Rows held and not yet forgotten."""
        return self._held

    def _locate(self, row: int) -> tuple[_Chunk, int]:
        offset = row - self._first_row
        if offset < 0:
            raise LookupError(f"finished row {row} was dropped by forget; views do not last")
        chunk, i = divmod(offset, CHUNK_ROWS)
        return self._chunks[chunk], i

    def add(
        self,
        request_id: str,
        left_ts: float,
        *,
        prompt_tokens: int,
        prompt_key: int,
        output_tokens: int | None,
        estimated: bool,
        finish_ts: float | None,
        reason: str | None,
        finish_ref: int,
        progress_seen: int = -1,
    ) -> None:
        """Remember a request that left at `left_ts` (its finish's time, or, for a ghost,
        the sweep's: then `finish_ts` is None)."""
        chunk = self._chunks[-1]
        if chunk.size == CHUNK_ROWS:
            self._seal()
            chunk = _Chunk()
            self._chunks.append(chunk)
        i = chunk.size
        chunk.size += 1
        chunk.left_ts[i] = left_ts
        chunk.unforgotten_min = min(chunk.unforgotten_min, left_ts)
        row = self._next_row
        keys = chunk.keys[i]
        keys[_PROMPT_KEY] = prompt_key
        keys[_FINISH_REF] = finish_ref
        flags = 0
        if estimated:
            flags |= _ESTIMATED
        if finish_ts is None:
            flags |= _NO_FINISH_TS
        if output_tokens is None:
            flags |= _NO_OUTPUT
            output_tokens = 0
        low, high = _INT32_MIN, _INT32_MAX
        if (
            low <= prompt_tokens <= high
            and low <= output_tokens <= high
            and low <= progress_seen <= high
        ):
            counts = chunk.counts[i]
            counts[_PROMPT_TOKENS] = prompt_tokens
            counts[_OUTPUT_TOKENS] = output_tokens
            counts[_PROGRESS_SEEN] = progress_seen
        else:
            flags |= _WIDE
            self._wide[row] = [int(prompt_tokens), int(output_tokens), int(progress_seen)]
        chunk.flags[i] = flags
        code = 0 if reason is None else self._reason_codes.get(reason)
        chunk.reasons[i] = self._reason_code(reason, row) if code is None else code
        self._open[hash(request_id)] = row
        self._next_row += 1
        self._held += 1

    def _reason_code(self, reason: str | None, row: int) -> int:
        if reason is None:
            return 0
        code = self._reason_codes.get(reason)
        if code is None:
            if len(self._reason_names) < _REASON_CODES:
                code = self._reason_codes[reason] = len(self._reason_names)
                self._reason_names.append(reason)
            else:  # a stream of ever new reasons: each row keeps its own
                self._own_reasons[row] = reason
                return _OWN_REASON
        return code

    def _set_count(self, chunk: _Chunk, i: int, row: int, column: int, value: int) -> None:
        if chunk.flags[i] & _WIDE:
            self._wide[row][column] = int(value)
        elif _INT32_MIN <= value <= _INT32_MAX:
            chunk.counts[i, column] = value
        else:
            counts = [int(count) for count in chunk.counts[i]]
            counts[column] = int(value)
            self._wide[row] = counts
            chunk.flags[i] |= np.uint8(_WIDE)

    def _seal(self) -> None:
        """The last chunk is full: its rows join the sorted index (rows of dropped
        chunks leave it here)."""
        rows = self._rows.astype(np.int64) + self._rows_base
        keep = rows >= self._first_row
        hashes = np.concatenate((self._hashes[keep], np.fromiter(self._open.keys(), np.int64)))
        rows = np.concatenate((rows[keep], np.fromiter(self._open.values(), np.int64)))
        order = np.argsort(hashes, kind="stable")
        self._rows_base = self._first_row
        self._hashes, self._rows = hashes[order], (rows[order] - self._rows_base).astype(np.int32)
        self._open = {}

    def _row_of(self, request_id: str) -> int | None:
        key = hash(request_id)
        row = self._open.get(key)
        if row is None:
            hashes = self._hashes
            at = int(hashes.searchsorted(key, "right")) - 1
            if at < 0 or hashes[at] != key:
                return None
            row = int(self._rows[at]) + self._rows_base
            if row < self._first_row:
                return None
        chunk, i = self._locate(row)
        return None if chunk.flags[i] & _FORGOTTEN else row

    def get(self, request_id: str) -> FinishedRequest | None:
        row = self._row_of(request_id)
        return None if row is None else FinishedRequest(self, row, request_id)

    def __contains__(self, request_id: str) -> bool:
        return self._row_of(request_id) is not None

    def forget(self, before_ts: float) -> int:
        """Forget the rows that left before `before_ts`; returns how many. Chunks whose
        rows are all forgotten are dropped, except the one being filled."""
        forgotten = 0
        for chunk in self._chunks:
            if chunk.unforgotten_min >= before_ts:
                continue
            left, flags = chunk.left_ts[: chunk.size], chunk.flags[: chunk.size]
            alive = (flags & _FORGOTTEN) == 0
            going = alive & (left < before_ts)
            forgotten += int(np.count_nonzero(going))
            flags[going] |= np.uint8(_FORGOTTEN)
            staying = alive & ~going
            chunk.unforgotten_min = float(left[staying].min()) if staying.any() else float("inf")
        chunks, first_row = self._chunks, self._first_row
        while len(chunks) > 1 and chunks[0].unforgotten_min == float("inf"):
            chunks.popleft()
            self._first_row += CHUNK_ROWS
        if self._first_row != first_row:  # chunks went: their rows' entries beside go too
            for beside in (self._wide, self._own_reasons):
                for row in [row for row in beside if row < self._first_row]:
                    del beside[row]
        self._held -= forgotten
        return forgotten


class RequestTable:
    """The requests a mirror knows: live ones as `RequestState`s by id, finished ones in
    the `FinishedLedger` until forgotten. Looked up like a dict; not iterable, as the
    ledger keeps no ids (`live` lists the live ones)."""

    __slots__ = ("finished", "live")

    #: finished requests are found by id only (see the module's docstring)
    __iter__ = None

    def __init__(self) -> None:
        self.live: dict[str, RequestState] = {}
        self.finished = FinishedLedger()

    def get(self, request_id: str, default: None = None) -> RequestState | FinishedRequest | None:
        request = self.live.get(request_id)
        if request is not None:
            return request
        done = self.finished.get(request_id)
        return default if done is None else done

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.live or (
            isinstance(request_id, str) and request_id in self.finished
        )

    def __getitem__(self, request_id: str) -> RequestState | FinishedRequest:
        request = self.get(request_id)
        if request is None:
            raise KeyError(request_id)
        return request

    def __setitem__(self, request_id: str, request: RequestState) -> None:
        self.live[request_id] = request

    def __delitem__(self, request_id: str) -> None:
        del self.live[request_id]

    def __len__(self) -> int:
        return len(self.live) + len(self.finished)
