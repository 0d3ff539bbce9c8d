"""Builds and owns what one service instance runs: the store, the pipeline, and the
worker processes for the audit and the window replays. `shadow serve` and
`shadow ingest` both start one, so a recorded file and a live stream meet the same code."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import duckdb
from sqlalchemy.exc import DBAPIError

from shadow.service.footprint import HeapTrimmer
from shadow.service.ingest.pipeline import Pipeline
from shadow.service.interpreter import tune_interpreter
from shadow.service.plugins import import_policy_modules
from shadow.service.retention import Retention
from shadow.service.settings import ServiceSettings
from shadow.service.store import ServiceStore
from shadow.service.window_runs import ready
from shadow.service.workers import audit_worker, window_worker


class DatabaseBusy(RuntimeError):
    """Another process holds the database file."""

    @classmethod
    def of(cls, path: Path, error: BaseException) -> DatabaseBusy | None:
        """The clear error for `error` (DuckDB's, bare or wrapped by SQLAlchemy) when it
        says that another process holds the file's lock; None for any other error."""
        cause = error.orig if isinstance(error, DBAPIError) else error
        if not isinstance(cause, duckdb.IOException) or "lock" not in str(cause).lower():
            return None
        pid = re.search(r"\(PID (\d+)\)", str(cause))
        holder = f"process {pid.group(1)}" if pid else "another process"
        return cls(
            f"{path} is in use by {holder} (a running `shadow serve`?); stop it or use another --db"
        )


def ensure_database_free(path: Path) -> None:
    """Raise `DatabaseBusy` when another process holds the file. `shadow serve` asks
    before it starts the server, whose start-up failures end in an ASGI traceback."""
    if not Path(path).exists():
        return
    try:
        duckdb.connect(str(path), read_only=True).close()
    except duckdb.Error as error:
        busy = DatabaseBusy.of(path, error)
        if busy is not None:
            raise busy from None
        # anything else is reported when the service opens the file


class Runtime:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        try:
            self.store = ServiceStore(settings.db, memory_mb=settings.duckdb_memory_mb)
        except (duckdb.IOException, DBAPIError) as error:
            busy = DatabaseBusy.of(settings.db, error)
            if busy is not None:
                raise busy from None
            raise
        import_policy_modules(settings.policy_modules)
        config = settings.pipeline()
        #: worker pools by role (`audit`, `windows`)
        self._workers: dict[str, ProcessPoolExecutor] = {}
        audit_executor = window_executor = None
        if settings.workers_processes:
            if config.audit_enabled:
                audit_executor = audit_worker(
                    config.audit,
                    config.invariants,
                    config.ghost_sweep_every_s,
                    tuple(settings.policy_modules),
                    settings.workers_nice,
                )
                self._workers["audit"] = audit_executor
            if config.windows_enabled:
                window_executor = window_worker(
                    tuple(settings.policy_modules), settings.workers_nice
                )
                self._workers["windows"] = window_executor
        self.pipeline = Pipeline(self.store, config, window_executor, audit_executor)
        self.rebuilt_events = self.pipeline.start()
        #: archive runs to Parquet (scheduled when `[storage] retention_days` is set)
        self.retention = Retention(self.store, self.pipeline.committer, settings.storage)
        self.retention.start()
        self.heap_trimmer = HeapTrimmer().start()

    def start_workers(self, timeout_s: float = 120.0) -> dict[str, float]:
        """Start the worker processes now, each with the modules its first task needs,
        and wait for them; seconds each took, by role.

        A pool starts its process on its first task. Left to that, the first batches
        waited for two interpreters to start and import (~0.3 s of CPU each, the window
        worker ~0.2 s more at its first window) while they competed with ingest for the
        cores: `bench ingest --counterfactuals`'s file pass ran at 46,328 events/s
        against 50,624 with them started first (medians). A service starts them before
        it answers, the file ingest before its first batch."""
        tasks = {"audit": os.getpid, "windows": ready}
        started = time.perf_counter()
        pending = {role: pool.submit(tasks[role]) for role, pool in self._workers.items()}
        took: dict[str, float] = {}
        for role, future in pending.items():
            try:
                future.result(timeout=max(0.0, started + timeout_s - time.perf_counter()))
            except Exception as error:
                raise RuntimeError(f"the {role} worker process did not start: "
                                   f"{type(error).__name__}: {error}") from error  # fmt: skip
            took[role] = time.perf_counter() - started
        return took

    def start_ingesting(self) -> dict[str, float]:
        """`start_workers`, then this process's interpreter set up for ingest
        (`tune_interpreter`): what a process that applies batches itself does before its
        first one (`shadow ingest`, and the benchmarks' file passes, which time its
        pipeline in their own process). With CPython's default collector such a pass ran a
        full collection over everything the mirror holds every second or so."""
        took = self.start_workers()
        tune_interpreter()
        return took

    def worker_pids(self) -> dict[str, list[int]]:
        """The live worker processes, by role (`audit`, `windows`)."""
        roles = {}
        for role, executor in self._workers.items():
            processes = getattr(executor, "_processes", None) or {}
            roles[role] = [pid for pid, process in processes.items() if process.is_alive()]
        return roles

    def close(self) -> None:
        self.heap_trimmer.close()
        self.retention.close()
        try:
            if not self.pipeline.broken:
                self.pipeline.drain()
                self.pipeline.collect_windows(wait=True)
        finally:
            self.pipeline.close()
            for executor in self._workers.values():
                executor.shutdown(wait=True, cancel_futures=True)
            self.store.close()
