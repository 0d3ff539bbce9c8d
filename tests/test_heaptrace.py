"""The heap trace (SHADOW_HEAP_TRACE_DIR) a process starts for memory hunts: off by
default; on, it dumps the allocators' totals and, with frames, the sites that grew."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shadow.service.heaptrace import start_heap_trace

GROW = """
import time
from shadow.service.heaptrace import start_heap_trace
assert start_heap_trace("probe")
time.sleep(0.3)
kept = [bytearray(1000) for _ in range(20_000)]  # ~20 MiB that stays
time.sleep(1.0)
"""


def _run(tmp_path: Path, frames: int) -> str:
    env = {**os.environ, "SHADOW_HEAP_TRACE_DIR": str(tmp_path),
           "SHADOW_HEAP_TRACE_EVERY_S": "0.5", "SHADOW_HEAP_TRACE_FRAMES": str(frames)}  # fmt: skip
    subprocess.run([sys.executable, "-c", GROW], env=env, check=True, timeout=60)
    (dump,) = tmp_path.glob("probe-*.txt")
    return dump.read_text()


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv("SHADOW_HEAP_TRACE_DIR", raising=False)
    assert start_heap_trace("server") is False


def test_the_trace_names_the_site_that_grew(tmp_path):
    text = _run(tmp_path, frames=2)
    # (pymalloc's own stats are not there while tracemalloc wraps the allocator)
    assert "resident" in text and "malloc in use" in text and "traced" in text
    grown = [line for line in text.splitlines() if "<string>:6" in line]
    assert grown and float(grown[0].split()[0]) >= 15.0  # MiB, the bytearrays


def test_without_frames_only_totals(tmp_path):
    text = _run(tmp_path, frames=0)
    assert "pymalloc arenas" in text and "traced" not in text and "grew most" not in text
