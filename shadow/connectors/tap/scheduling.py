"""The tap's scheduling slice: it asks Linux for short slices, so that the relay's thread,
woken by a chunk from the engine, runs at once instead of after a busy neighbour's slice.

Linux's scheduler (EEVDF, 6.6 and later) lets a running task finish its slice before a
task it woke runs; the default slice is 0.7 ms times 1 + log2(CPUs) (1.4 ms on 2 CPUs).
A tap sharing its CPU with anything busy (here: the bench's recorder, clients and
service; in a fleet: a sidecar's neighbours) then holds a chunk up to that long, which
is the tail the 1 ms P99 target is about. Since 6.12 a task may ask for a shorter slice
(`sched_setattr`, `sched_runtime` under the normal policies, 0.1-100 ms), and a task with
a shorter slice preempts on wake-up. It gets no larger share of the CPU (its nice value
and weight are unchanged), only shorter turns, and needs no privilege.

The request reads the thread's attributes, changes only the slice and writes them back
(policy, nice value and flags kept), and the slice in force is read back the same way
(`sched_getattr` reports a normal task's slice since 6.12, 0 before). Threads and
processes the thread starts afterwards inherit the slice. A seccomp filter that kills on
`sched_setattr` would kill the tap at start: `sched_slice_us = 0` never calls it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from dataclasses import dataclass

#: what `shadow tap` asks for by default: the shortest slice the kernel grants
DEFAULT_SLICE_US = 100
#: the range the kernel clamps a requested slice to (kernel/sched/syscalls.c)
MIN_SLICE_US, MAX_SLICE_US = 100, 100_000
#: (sched_setattr, sched_getattr) by machine, for 64-bit processes
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
#: the policies whose tasks take a custom slice: SCHED_OTHER, SCHED_BATCH
_FAIR_POLICIES = (0, 3)


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
    """The slice in force for the thread after the request (None: the kernel does not
    report one), and why it is not the one asked for (None when it is)."""

    slice_us: float | None
    problem: str | None = None


def _syscalls() -> tuple[int, int] | None:
    if platform.system() != "Linux" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None  # a 32-bit process on a 64-bit kernel has other numbers
    return _SYSCALLS.get(platform.machine())


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _call(number: int, *args: object) -> int:
    """The raw syscall; the errno on failure, 0 on success."""
    if _libc().syscall(ctypes.c_long(number), *args) != 0:
        return ctypes.get_errno() or -1
    return 0


def _attributes(tid: int) -> _SchedAttr | str:
    """Thread `tid`'s scheduling attributes (0: the calling thread), or why not."""
    numbers = _syscalls()
    if numbers is None:
        return f"not supported on {platform.system()} {platform.machine()}"
    attr = _SchedAttr()
    size = ctypes.sizeof(_SchedAttr)
    error = _call(numbers[1], ctypes.c_int(tid), ctypes.byref(attr), ctypes.c_uint(size),
                  ctypes.c_uint(0))  # fmt: skip
    return f"sched_getattr failed: {os.strerror(error)}" if error else attr


def current_slice_us(tid: int = 0) -> float | None:
    """Thread `tid`'s slice in microseconds (0: the calling thread; a process's pid: its
    main thread); None where the kernel does not report one (before 6.12, not Linux)."""
    return _slice_of(_attributes(tid))


def _slice_of(attr: _SchedAttr | str) -> float | None:
    if isinstance(attr, str) or attr.sched_policy not in _FAIR_POLICIES:
        return None
    return attr.sched_runtime / 1000 if attr.sched_runtime else None


def request_slice(microseconds: int) -> SliceOutcome:
    """Ask the kernel for slices of `microseconds` for the calling thread; 0 asks nothing.
    Never raises: a kernel or platform that cannot do it leaves the slice as it was, and
    the outcome says why."""
    attr = _attributes(0)
    before = _slice_of(attr)
    if microseconds == 0:
        return SliceOutcome(before)
    if isinstance(attr, str):
        return SliceOutcome(before, attr)
    if attr.sched_policy not in _FAIR_POLICIES:
        return SliceOutcome(before, f"the thread's policy ({attr.sched_policy}) takes no slice")
    clamped = min(max(microseconds, MIN_SLICE_US), MAX_SLICE_US)
    attr.size = ctypes.sizeof(_SchedAttr)
    attr.sched_runtime = clamped * 1000
    set_number = _SYSCALLS[platform.machine()][0]  # `_attributes` found the numbers
    error = _call(set_number, ctypes.c_int(0), ctypes.byref(attr), ctypes.c_uint(0))
    if error:
        return SliceOutcome(before, f"sched_setattr failed: {os.strerror(error)}")
    after = current_slice_us()
    if after != clamped:
        return SliceOutcome(after, f"the kernel ({platform.release()}) kept its slice: "
                                   "custom slices need Linux 6.12+")  # fmt: skip
    if clamped != microseconds:
        return SliceOutcome(after, f"{microseconds} us is outside the kernel's "
                                   f"{MIN_SLICE_US}-{MAX_SLICE_US} us: {clamped} us")  # fmt: skip
    return SliceOutcome(after)
