"""Builds and owns what one service instance runs: the store, the pipeline, and the
worker processes for the audit and the window replays. `shadow serve` and
`shadow ingest` both start one, so a recorded file and a live stream meet the same code."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import duckdb

from shadow.service.pipeline import Pipeline
from shadow.service.settings import ServiceSettings
from shadow.service.store import ServiceStore
from shadow.service.workers import audit_worker, window_worker


class DatabaseBusy(RuntimeError):
    """Another process holds the database file."""


class Runtime:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        try:
            self.store = ServiceStore(settings.db)
        except duckdb.IOException as error:
            if "lock" in str(error).lower():
                raise DatabaseBusy(
                    f"{settings.db} is in use by another process (a running `shadow serve`?); "
                    "stop it or use another --db"
                ) from None
            raise
        config = settings.pipeline()
        self._executors: list[ProcessPoolExecutor] = []
        audit_executor = window_executor = None
        if settings.workers_processes:
            if settings.audit:
                audit_executor = audit_worker(
                    config.audit, config.invariants, config.ghost_sweep_every_s
                )
                self._executors.append(audit_executor)
            if settings.windows:
                window_executor = window_worker()
                self._executors.append(window_executor)
        self.pipeline = Pipeline(self.store, config, window_executor, audit_executor)
        self.rebuilt_events = self.pipeline.start()

    def close(self) -> None:
        try:
            if not self.pipeline.broken:
                self.pipeline.drain()
                self.pipeline.collect_windows(wait=True)
        finally:
            for executor in self._executors:
                executor.shutdown(wait=True, cancel_futures=True)
            self.store.close()
