"""The continuous runs held by the process that evaluates windows (the window worker, or
the service's own when windows are evaluated inline), and the worker's entry point.

Apart from the scheduler (`ingest/windows.py`), which stores results: the window worker
unpickles these functions by their module, so this module's imports are what the worker
loads. From the scheduler's module it loaded the storage stack too (SQLAlchemy, Alembic,
the ORM models), ~0.5 s of its start and ~54 MiB resident it never used."""

from __future__ import annotations

import os
from collections.abc import Callable

from shadow.service.footprint import return_free_heap
from shadow.stream.continuous import ContinuousCounterfactuals
from shadow.stream.windows import WindowResult, WindowSpec

#: the continuous runs of each (scheduler, fleet), in the process that evaluates windows
#: (the window worker process, or the service's own when windows are evaluated inline)
_CONTINUOUS: dict[tuple[str, str], ContinuousCounterfactuals] = {}


def evaluate_continuous(owner: str, spec: WindowSpec) -> WindowResult:
    """Window `spec` from its fleet's continuous runs (started on the first one)."""
    key = (owner, spec.fleet)
    runs = _CONTINUOUS.get(key)
    if runs is None:
        runs = _CONTINUOUS[key] = ContinuousCounterfactuals(spec.fleet)
    return runs.evaluate(spec)


def evaluate_in_worker(evaluate: Callable[..., WindowResult], *args: object) -> WindowResult:
    """`evaluate(*args)` in the window worker process, then its free heap handed back: an
    evaluation's arrays are short-lived and large (a continuous run's first window peaks
    at hundreds of MiB), and glibc would keep what they held resident for good."""
    try:
        return evaluate(*args)
    finally:
        return_free_heap()


def ready() -> int:
    """The window worker's warm-up task (`Runtime.start_workers`): unpickled by this
    module's name, it makes the worker import what its first window needs."""
    return os.getpid()
