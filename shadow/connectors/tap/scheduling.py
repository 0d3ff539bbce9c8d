"""The tap's scheduling slice: it asks Linux for short slices, so that the relay's thread,
woken by a chunk from the engine, runs at once instead of after a busy neighbour's slice.

Linux's scheduler (EEVDF, 6.6 and later) lets a running task finish its slice before a
task it woke runs; the default slice is 0.7 ms times 1 + log2(CPUs) (1.4 ms on 2 CPUs).
A tap sharing its CPU with anything busy (here: the bench's recorder, clients and
service; in a fleet: a sidecar's neighbours) then holds a chunk up to that long, which
is the tail the 1 ms P99 target is about. Since 6.12 a task may ask for a shorter slice
(`sched_setattr`, `sched_runtime` under SCHED_OTHER, 0.1-100 ms), and a task with a
shorter slice preempts on wake-up. It gets no larger share of the CPU (its nice value
and weight are unchanged), only shorter turns, and needs no privilege. The kernel clamps
the request; the slice in force is read back from `/proc/thread-self/sched`.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass
from pathlib import Path

#: what `shadow tap` asks for by default: the shortest slice the kernel grants
DEFAULT_SLICE_US = 100
#: the range the kernel clamps a requested slice to (kernel/sched/syscalls.c)
MIN_SLICE_US, MAX_SLICE_US = 100, 100_000
_SYSCALL = {"x86_64": 314, "aarch64": 274}  # sched_setattr(2)
_SCHED_OTHER = 0


class _SchedAttr(ctypes.Structure):
    """`struct sched_attr` (include/uapi/linux/sched/types.h), version 1: 56 bytes."""

    _fields_ = [
        ("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32), ("sched_util_max", ctypes.c_uint32),
    ]  # fmt: skip


@dataclass(frozen=True)
class SliceOutcome:
    """The slice in force for the calling thread after the request (None: not readable),
    and why it is not the one asked for (None when it is)."""

    slice_us: float | None
    problem: str | None = None


def current_slice_us(sched_file: Path = Path("/proc/thread-self/sched")) -> float | None:
    """The calling thread's scheduler slice (`se.slice`, microseconds); None where the
    kernel does not show one (before EEVDF, or not Linux)."""
    try:
        text = sched_file.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "se.slice":
            return int(value.strip()) / 1000
    return None


def request_slice(microseconds: int) -> SliceOutcome:
    """Ask the kernel for slices of `microseconds` for the calling thread (its policy,
    SCHED_OTHER, and its nice value kept). Never raises: a kernel or platform that cannot
    do it leaves the default slice, and the outcome says why."""
    before = current_slice_us()
    number = _SYSCALL.get(platform.machine())
    if platform.system() != "Linux" or number is None:
        return SliceOutcome(before, f"not supported on {platform.system()} {platform.machine()}")
    if os.sched_getscheduler(0) != _SCHED_OTHER:
        return SliceOutcome(before, "the thread is not under the normal policy (SCHED_OTHER)")
    granted = min(max(microseconds, MIN_SLICE_US), MAX_SLICE_US)  # what the kernel clamps to
    attr = _SchedAttr(
        size=ctypes.sizeof(_SchedAttr), sched_policy=_SCHED_OTHER,
        sched_nice=os.getpriority(os.PRIO_PROCESS, 0), sched_runtime=granted * 1000,
    )  # fmt: skip
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, ctypes.byref(attr), 0) != 0:
        error = ctypes.get_errno()
        return SliceOutcome(before, f"sched_setattr failed: {os.strerror(error)}")
    after = current_slice_us()
    if after != granted:
        release = platform.release()
        return SliceOutcome(after, f"the kernel ({release}) kept its slice: custom slices "
                                   "need Linux 6.12+")  # fmt: skip
    if granted != microseconds:
        return SliceOutcome(after, f"{microseconds} us is outside the kernel's "
                                   f"{MIN_SLICE_US}-{MAX_SLICE_US} us: {granted} us")  # fmt: skip
    return SliceOutcome(after)
