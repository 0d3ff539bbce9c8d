"""Where a long-lived process's Python memory grows: a debugging aid for memory that is
not flat (issue 24's G = 256 runs grew 87-202 MiB/min and nobody knew in which process
or structure).

Off unless `SHADOW_HEAP_TRACE_DIR` names a directory. Then every process that calls
`start_heap_trace(role)` (the server and its worker processes) runs `tracemalloc` and,
every `SHADOW_HEAP_TRACE_EVERY_S` seconds (default 30), appends to
`<dir>/<role>-<pid>.txt` its traced total, its resident memory, and the allocation sites
that grew most since the previous dump and since the first one. Memory outside Python's
allocator (DuckDB's buffer pool, numpy's large arrays are traced; malloc's free lists
are not) shows as resident memory that the traced total does not explain.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

from shadow.service.footprint import resident_bytes

TRACE_DIR_ENV = "SHADOW_HEAP_TRACE_DIR"
TRACE_EVERY_ENV = "SHADOW_HEAP_TRACE_EVERY_S"
#: frames kept per allocation (0: no tracemalloc, only the allocators' totals, which
#: cost nothing; tracing slows the process several times over)
TRACE_FRAMES_ENV = "SHADOW_HEAP_TRACE_FRAMES"
#: enough frames to tell which caller of a shared helper grows
TRACE_FRAMES = 6
#: sites listed per dump
TOP_SITES = 25


def start_heap_trace(role: str) -> bool:
    """Start tracing and the dump thread when the environment asks for it; True if it did."""
    directory = os.environ.get(TRACE_DIR_ENV)
    if not directory:
        return False
    every_s = float(os.environ.get(TRACE_EVERY_ENV, "30"))
    frames = int(os.environ.get(TRACE_FRAMES_ENV, str(TRACE_FRAMES)))
    path = Path(directory) / f"{role}-{os.getpid()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if frames > 0:
        tracemalloc.start(frames)
    threading.Thread(
        target=_dump_forever, args=(path, every_s), daemon=True, name="heap-trace"
    ).start()
    return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def _native() -> str:
    """What the C allocators hold: glibc malloc's bytes in use and free inside its heaps
    (free but resident is fragmentation), and Arrow's pool (it allocates with its own
    mimalloc, which tracemalloc does not see)."""
    parts = []
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        parts.append(f"malloc in use {(info.uordblks + info.hblkhd) / 2**20:.1f} MiB "
                     f"(mmapped {info.hblkhd / 2**20:.1f}), free in its heaps "
                     f"{info.fordblks / 2**20:.1f} MiB")  # fmt: skip
    except (OSError, AttributeError):
        parts.append("malloc: no mallinfo2")
    parts.append(_pymalloc())
    arrow = sys.modules.get("pyarrow")
    if arrow is not None:
        pool = arrow.default_memory_pool()
        parts.append(f"Arrow {pool.bytes_allocated() / 2**20:.1f} MiB "
                     f"(max {pool.max_memory() / 2**20:.1f})")  # fmt: skip
    return ", ".join(parts)


def _pymalloc() -> str:
    """Python's small-object allocator: its arenas (1 MiB each, returned only when wholly
    empty) against the bytes of live blocks in them; arenas far above the live bytes are
    fragmentation. `sys._debugmallocstats` writes to the C stderr, read back here."""
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    arenas = re.search(r"(\d+) arenas \* (\d+) bytes/arena", text)
    live = re.search(r"# bytes in allocated blocks\s+=\s+([\d,]+)", text)
    if arenas is None or live is None:
        return "pymalloc: no stats"
    held = int(arenas.group(1)) * int(arenas.group(2))
    return (f"pymalloc arenas {held / 2**20:.1f} MiB, live blocks "
            f"{int(live.group(1).replace(',', '')) / 2**20:.1f} MiB")  # fmt: skip


def _dump_forever(path: Path, every_s: float) -> None:
    started = time.monotonic()
    tracing = tracemalloc.is_tracing()
    first = previous = tracemalloc.take_snapshot() if tracing else None
    while True:
        time.sleep(every_s)
        rss = (resident_bytes(os.getpid()) or 0) / 2**20
        header = f"== {time.monotonic() - started:.0f} s: resident {rss:.1f} MiB; {_native()}"
        if not tracing:
            with path.open("a") as out:
                out.write(header + "\n")
            continue
        current = tracemalloc.take_snapshot()
        traced, peak = tracemalloc.get_traced_memory()
        lines = [f"{header}; traced {traced / 2**20:.1f} MiB (peak {peak / 2**20:.1f})"]
        for title, base in (("since the previous dump", previous), ("since the first", first)):
            lines.append(f"-- grew most {title}:")
            for stat in current.compare_to(base, "traceback")[:TOP_SITES]:
                if stat.size_diff <= 0:
                    break
                frames = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}"
                                     for f in stat.traceback)  # fmt: skip
                lines.append(f"{stat.size_diff / 2**20:+8.2f} MiB {stat.count_diff:+9d} "
                             f"blocks (now {stat.size / 2**20:7.2f}) {frames}")  # fmt: skip
        with path.open("a") as out:
            out.write("\n".join(lines) + "\n")
        previous = current
