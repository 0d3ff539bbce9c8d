"""The window worker process loads what it evaluates windows with, not the storage stack:
it unpickles its entry point by module, and from the scheduler's module that brought in
SQLAlchemy, Alembic and the ORM models (~0.5 s of its start, ~54 MiB resident)."""

from __future__ import annotations

import os

from shadow.service.ingest import windows
from shadow.service.window_runs import evaluate_continuous, evaluate_in_worker
from shadow.service.workers import window_worker

STORAGE_STACK = ("sqlalchemy", "alembic", "shadow.storage", "shadow.service.store")


def test_the_scheduler_sends_the_light_entry_points() -> None:
    assert windows.evaluate_in_worker is evaluate_in_worker
    assert windows.evaluate_continuous is evaluate_continuous
    assert evaluate_in_worker.__module__ == "shadow.service.window_runs"


def test_the_window_worker_runs_without_the_storage_stack() -> None:
    """A job through the real worker and its real entry point: `eval` (a builtin, so
    pickling it loads nothing) lists the worker's modules after the job."""
    executor = window_worker()
    try:
        loaded = executor.submit(
            evaluate_in_worker, eval, "sorted(__import__('sys').modules)"
        ).result(timeout=120)
    finally:
        executor.shutdown(wait=True)
    assert "shadow.stream.continuous" in loaded  # the entry point's module was loaded
    heavy = [m for m in loaded if m.startswith(STORAGE_STACK)]
    assert heavy == []


def test_the_service_starts_its_workers_before_the_first_event(tmp_path) -> None:
    """`Runtime.start_workers` (what `shadow serve` and `shadow ingest` call before their
    first batch): both worker processes run, and the window worker has already imported
    what its first window needs, so no batch waits for an interpreter to start."""
    from shadow.service.runtime import Runtime
    from shadow.service.settings import load_settings

    runtime = Runtime(load_settings(None, db=tmp_path / "w.duckdb", windows=True))
    try:
        assert runtime.worker_pids() == {"audit": [], "windows": []}  # a pool starts lazily
        took = runtime.start_workers()
        assert set(took) == {"audit", "windows"}
        pids = runtime.worker_pids()
        assert all(len(found) == 1 for found in pids.values()), pids
        loaded = runtime._workers["windows"].submit(eval, "sorted(__import__('sys').modules)")
        assert "shadow.stream.continuous" in loaded.result(timeout=60)
        runtime.start_workers()  # again: the same processes
        assert runtime.worker_pids() == pids
    finally:
        runtime.close()


def _niceness(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def test_the_workers_yield_the_cores_to_ingest_as_configured(tmp_path) -> None:
    """`workers_nice`: both worker processes run that much nicer than the service (the
    derived work takes the cycles ingest leaves); 0 leaves them at the service's."""
    from shadow.service.runtime import Runtime
    from shadow.service.settings import load_settings

    own = _niceness(os.getpid())
    for nice, expected in ((5, min(19, own + 5)), (0, own)):
        settings = load_settings(None, db=tmp_path / f"n{nice}.duckdb", windows=True,
                                 workers_nice=nice)  # fmt: skip
        runtime = Runtime(settings)
        try:
            runtime.start_workers()
            pids = runtime.worker_pids()
            assert {role: [_niceness(p) for p in found] for role, found in pids.items()} == {
                "audit": [expected],
                "windows": [expected],
            }, nice
        finally:
            runtime.close()
