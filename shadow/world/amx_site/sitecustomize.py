"""Ask Linux for the AMX tile state at the start of every vLLM process of the real-vLLM
world (this directory is first on their PYTHONPATH: `shadow.world.real_vllm.
engine_environment`).

vLLM 0.32's CPU attention runs on AMX tiles where the CPU has them (Sapphire Rapids and
later) without asking the kernel for them first (`arch_prctl(ARCH_REQ_XCOMP_PERM)`).
torch's oneDNN asks when it first uses AMX itself, which a prefill of 5 or more tokens
does; so a first request of 1-4 tokens reached the attention kernel first and the worker
died of SIGILL (measured here on 2026-12-02: every such first request, both DP ranks).
Asking costs one system call and does nothing where there is no AMX.
"""

import contextlib
import ctypes
import platform
import sys

if sys.platform == "linux" and platform.machine() == "x86_64":
    _SYS_ARCH_PRCTL = 158
    _ARCH_REQ_XCOMP_PERM = 0x1023
    _XFEATURE_XTILEDATA = 18
    with contextlib.suppress(OSError, AttributeError):  # no libc symbol: none to ask for
        ctypes.CDLL(None, use_errno=True).syscall(
            _SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA
        )
