"""Free memory inside glibc's heap stays resident until it is trimmed: the window worker
kept 765 MiB so at G = 256. `return_free_heap` and the `HeapTrimmer` hand it back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shadow.service.footprint import HEAP_ARENAS, HeapTrimmer, _libc

pytestmark = pytest.mark.skipif(_libc() is None, reason="glibc only")

FRAGMENT = """
import ctypes, sys, time
from shadow.service.footprint import HeapTrimmer, resident_bytes, return_free_heap
import os
mib = lambda: resident_bytes(os.getpid()) / 2**20
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = mib()
blocks = [libc.malloc(4000) for _ in range(50_000)]  # ~200 MiB in the main heap
for b in blocks:
    ctypes.memset(b, 1, 4000)
pin = libc.malloc(4000)  # the heap's top stays in use: nothing is trimmed by itself
for b in blocks:
    libc.free(b)
held = mib()
if sys.argv[1] == "now":
    return_free_heap()
    time.sleep(0.1)
else:
    trimmer = HeapTrimmer(every_s=0.1).start()
    time.sleep(0.5)
    trimmer.close()
    assert trimmer.trims >= 1
print(before, held, mib())
"""


@pytest.mark.parametrize("how", ["now", "trimmer"])
def test_freed_memory_goes_back_to_the_os(how):
    out = subprocess.run([sys.executable, "-c", FRAGMENT, how], capture_output=True,
                         text=True, check=True, timeout=60).stdout  # fmt: skip
    before, held, after = (float(x) for x in out.split())
    assert held - before > 150  # freed, yet resident
    assert after - before < 30  # returned


def test_the_trimmer_stops_on_close():
    trimmer = HeapTrimmer(every_s=0.01).start()
    trimmer.close()
    count = trimmer.trims
    assert not trimmer._thread.is_alive()
    assert trimmer.trims == count


ARENAS = """
import ctypes, os, sys, tempfile, threading
from shadow.service.footprint import limit_heap_arenas
capped = limit_heap_arenas() if sys.argv[1] == "cap" else False
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
def work():  # small blocks: from the thread's heap, not mmap
    keep = [bytes(200) + bytes([i % 256]) for i in range(20_000)]
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
path = os.path.join(tempfile.mkdtemp(), "info.xml")
out = libc.fopen(path.encode(), b"w"); libc.malloc_info(0, out); libc.fclose(out)
print(capped, open(path).read().count("<heap nr="))
"""


def _heaps(how: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", ARENAS, how], capture_output=True, text=True,
                         check=True, timeout=60, env=env).stdout.split()  # fmt: skip
    return out[0], int(out[1])


def test_the_heap_arenas_are_capped_unless_the_operator_chose():
    """Eight threads allocating: glibc gives them heaps of their own unless capped; the
    service caps them at HEAP_ARENAS, and an operator's MALLOC_ARENA_MAX stands."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _heaps("cap", env) == ("True", HEAP_ARENAS)
    assert _heaps("no", env)[1] > HEAP_ARENAS
    capped, heaps = _heaps("cap", env | {"MALLOC_ARENA_MAX": "4"})
    assert capped == "False" and heaps > HEAP_ARENAS
