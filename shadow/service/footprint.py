"""Resident memory and CPU time of the service's processes, read from `/proc` (Linux):
`/metrics` reports memory per process, the load benchmark sums both over the server's
process tree."""

from __future__ import annotations

import ctypes
import functools
import os
import threading


def resident_bytes(pid: int) -> int | None:
    """`VmRSS` of `pid`; None when it is gone or `/proc` is not there."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def process_tree(pid: int) -> list[int]:
    """`pid` and every live descendant of it (a server's worker processes)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        found.append(current)
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending += [int(child) for child in children.read().split()]
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return found


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time `pid` has used; None when it is gone or `/proc` is not there.
    The load benchmark divides it by the events acknowledged: CPU per event."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None  # not glibc


def return_free_heap() -> bool:
    """Hand the free memory inside glibc's heaps back to the OS (`malloc_trim(0)`); False
    where there is no glibc. A freed block stays resident until then, so a peak of
    short-lived arrays is kept for good: the window worker held 190 MiB free but resident
    after the first window's evaluation at G = 64 (its Python objects: 40 MiB)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


#: glibc heaps ("arenas") a service process allocates from (`limit_heap_arenas`)
HEAP_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def limit_heap_arenas(arenas: int = HEAP_ARENAS) -> bool:
    """Cap the glibc heaps this process allocates from (`mallopt(M_ARENA_MAX)`); False
    where there is no glibc or `MALLOC_ARENA_MAX` is set (the operator's choice, which
    glibc read at start, stands).

    By default glibc gives each thread that meets a busy heap one of its own, up to eight
    per core, and memory a burst freed in one stays resident there: at G = 256
    (`shadow bench fleet`'s HTTP pass) the server's resident memory rose +29, +9 and +30
    MiB/min over minutes 2-5 (least squares) with its Python objects flat; with 2 heaps,
    +5, +10 and +8, at the same CPU per event (docs/RELIABILITY.md). Call it first thing,
    before the process starts threads."""
    libc = _libc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


#: seconds between trims of a long-lived process's heap (`HeapTrimmer`)
TRIM_EVERY_S = 10.0


class HeapTrimmer:
    """Returns a process's free heap to the OS every `every_s` seconds, from a thread of
    its own (`malloc_trim` runs without the GIL). The server's many threads (HTTP, ingest,
    commits, DuckDB) each allocate in a glibc arena of their own, and what a burst freed
    stays resident in it: at G = 256 the server's free-but-resident heap grew from 30 to
    132 MiB in 150 s of ingest while its live objects held steady, the audit worker's to
    30 MiB."""

    def __init__(self, every_s: float = TRIM_EVERY_S) -> None:
        self.every_s = every_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heap-trim")

    def start(self) -> HeapTrimmer:
        if _libc() is not None:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if return_free_heap():
                self.trims += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
