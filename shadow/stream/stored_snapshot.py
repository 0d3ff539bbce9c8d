"""How a dispatch's frozen snapshot is stored: its JSON bytes, zlib-compressed when large.

One place for the format, which the audit writes (`stream.audit`, in the worker process,
so the server neither compresses nor ships the long form) and the readers undo
(`storage.queries`). At G = 256 the JSON is ~7.8 KB a dispatch, and DuckDB rewrites recent
row groups at its checkpoints, which run inside the server's group commits: stored as text
they held the commits for seconds (migration 0015). Rows stored before 0015 hold the JSON
as text, which `unpack` reads as well.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

#: zlib level: level 1 is 4.7x smaller at G = 256 and half level 6's time for 5% more
#: bytes (measured on 2,000 stored snapshots)
ZLIB_LEVEL = 1
#: Snapshots up to this many bytes of JSON are stored as they are: at G = 8 (~270 bytes)
#: zlib would cost ~8 us a dispatch, on the audit's critical path, to save ~110 bytes.
COMPRESS_OVER = 1024
#: The first byte of a zlib stream (deflate, 32 KiB window), which JSON never starts with.
ZLIB_HEADER = b"\x78"


def pack(encoded: bytes) -> bytes:
    """A snapshot's JSON bytes as stored: compressed when over `COMPRESS_OVER`."""
    return zlib.compress(encoded, ZLIB_LEVEL) if len(encoded) > COMPRESS_OVER else encoded


def unpack(stored: str | bytes) -> dict[str, Any]:
    """The snapshot from what `pack` stored, or from the JSON text stored before 0015."""
    if isinstance(stored, bytes) and stored[:1] == ZLIB_HEADER:
        stored = zlib.decompress(stored)
    return json.loads(stored)
