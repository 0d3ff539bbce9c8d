"""The real-vLLM world's own parts that need no vLLM: the model's shape check, the
process walk that renices a server's engines, and the engines' environment
(tests/test_vllm_e2e.py and test_vllm_plugin.py run them for real)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from shadow.world.real_vllm import AMX_SITE, descendants, engine_environment
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


def test_every_engine_process_asks_for_amx_first():
    """A process started with the engines' environment imports the AMX `sitecustomize`
    (first on PYTHONPATH, before what the caller put there), and on a CPU with AMX holds
    the tile permission (arch_prctl ARCH_GET_XCOMP_PERM has XTILEDATA, bit 18): vLLM's CPU
    attention died of SIGILL without it (test_vllm_plugin's 4-token first prompt)."""
    env = engine_environment({"PYTHONPATH": "/elsewhere", "VLLM_CPU_KVCACHE_SPACE": "4"})
    assert env["PYTHONPATH"].split(":") == [str(AMX_SITE), "/elsewhere"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    code = (
        "import ctypes, sitecustomize; mask = ctypes.c_uint64(0); "
        "ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask)); "
        "print(sitecustomize.__file__, mask.value)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    assert out[0] == str(AMX_SITE / "sitecustomize.py")
    with open("/proc/cpuinfo") as cpuinfo:
        has_amx = " amx_tile" in cpuinfo.read()
    assert bool(int(out[1]) & (1 << 18)) == has_amx, (out, has_amx)
