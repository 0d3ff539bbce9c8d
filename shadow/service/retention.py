"""The service's retention: archive runs (`shadow.storage.archive`) beside live ingest.

A run writes each chunk's Parquet file on its own thread and connection, and hands only
the chunk's delete (and its listing) to the group committer, between two ingest
transactions: ingest waits at most one small delete per chunk, never the whole run. With
`[storage] retention_days` set, a thread runs one every `every_s`; `POST
/v1/storage/archive` runs one on demand. One run at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from shadow.service.ingest.committer import GroupCommitter
from shadow.service.store import ServiceStore
from shadow.storage.archive import (
    ArchiveResult,
    RetentionConfig,
    archive_before,
    archive_root,
    retention_cutoff,
)

log = logging.getLogger(__name__)
#: seconds between chunks: room for the ingest's own commits
CHUNK_PAUSE_S = 0.05


class Retention:
    """Archive runs over one service store; counts what they did for /metrics."""

    def __init__(
        self, store: ServiceStore, committer: GroupCommitter, config: RetentionConfig
    ) -> None:
        self.store = store
        self.committer = committer
        self.config = config
        self.root: Path = archive_root(store.path, config.archive_dir)
        self.runs = 0
        self.failures = 0
        self.last: ArchiveResult | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, before: float) -> ArchiveResult:
        """Archive every row with `ts < before`, now (waits for a run in progress)."""
        with self._lock:
            try:
                result = archive_before(
                    self.store.engine,
                    self.store.path,
                    self.root,
                    before,
                    chunk_rows=self.config.chunk_rows,
                    on_writer=self.committer.run_between,
                    pause_s=CHUNK_PAUSE_S,
                )
            except Exception:
                self.failures += 1
                raise
            self.runs += 1
            self.last = result
            return result

    def start(self) -> None:
        """Run on schedule when `retention_days` is set (the first run soon after start)."""
        if self.config.retention_days is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="retention", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        days = self.config.retention_days
        assert days is not None
        if self._stop.wait(1.0):  # let start-up finish first
            return
        while True:
            try:
                result = self.run(retention_cutoff(days, time.time()))
                if result.files:
                    log.info("retention archived %s", result.as_json())
            except Exception:  # the rows stay live; the next run moves them
                log.warning("retention run failed; retried in %.0f s", self.config.every_s,
                            exc_info=True)  # fmt: skip
            if self._stop.wait(self.config.every_s):
                return
