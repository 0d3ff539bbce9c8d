"""The real-vLLM world's own parts that need no vLLM: the model's shape check, and the
process walk that renices a server's engines (tests/test_vllm_e2e.py runs them for real)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from shadow.world.real_vllm import descendants
from shadow.world.tiny_model import build_tiny_model


@pytest.mark.parametrize(("hidden", "layers"), [(100, 2), (0, 2), (128, 0)])
def test_a_model_shape_the_cpu_kernel_refuses_is_a_clear_error(tmp_path, hidden, layers):
    with pytest.raises(ValueError, match="hidden must be a positive multiple of 64"):
        build_tiny_model(tmp_path / "m", hidden, layers)
    assert not (tmp_path / "m").exists()  # refused before anything is written


def test_descendants_are_every_process_below_and_only_those():
    # a child that starts a grandchild, both sleeping until killed
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(below := descendants(child.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(below) == 1 and child.pid not in below
        grandchild = below[0]
        assert descendants(grandchild) == []
        assert child.pid in descendants(_parent_of(child.pid))  # and this test above it
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(child.pid)], check=False)
        child.wait()


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])
