"""Resident memory and CPU time of the service's processes, read from `/proc` (Linux):
`/metrics` reports memory per process, the load benchmark sums both over the server's
process tree."""

from __future__ import annotations

import os


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
