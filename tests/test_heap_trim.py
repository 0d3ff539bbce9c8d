"""Free memory inside glibc's heap stays resident until it is trimmed: the window worker
kept 765 MiB so at G = 256. `return_free_heap` and the `HeapTrimmer` hand it back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shadow.service.footprint import HeapTrimmer, _libc

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
