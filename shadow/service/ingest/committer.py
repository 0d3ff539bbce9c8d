"""Group commit: acknowledged batches are written by one thread, in the order they were
applied, several to a transaction when they queue up.

The ingest lock covers what must be serial (dedupe, the reorder window, the mirror);
the DuckDB transaction that makes a batch durable does not need it. Handing the
transaction to this thread frees the lock for the next batch while DuckDB writes (it
releases the GIL while a statement runs), and batches that arrive while a transaction is
open share the next one, so DuckDB's fixed cost per statement (about 0.3 ms, 3 ms for an
upsert) is paid once for all of them. A batch is acknowledged only when the transaction
that holds it has committed (`CommitJob.wait`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shadow.service.store import EventBatch

log = logging.getLogger(__name__)

#: (batch, next ingest id, decisions, violations, applied-through checkpoint)
CommitFn = Callable[[EventBatch, int, Sequence[Any], Sequence[Any], int], None]


@dataclass
class CommitJob:
    """One batch's rows and the counters after it; `wait` returns once it is durable."""

    batch: EventBatch
    next_ingest_id: int
    decisions: Sequence[Any]
    violations: Sequence[Any]
    applied_through: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def wait(self) -> None:
        """Block until the transaction holding this job ends; raise its failure."""
        self.done.wait()
        if self.error is not None:
            raise self.error

    def rows(self) -> int:
        return len(self.batch) + len(self.decisions) + len(self.violations)


def merge(jobs: Sequence[CommitJob]) -> CommitJob:
    """One job holding every row of `jobs` (in order) and the counters of the last.

    Later jobs win for the per-key rows, which is what committing them one after another
    would leave: a request's progress and a source's highest seq only grow.
    """
    if len(jobs) == 1:
        return jobs[0]
    batch = EventBatch()
    decisions: list[Any] = []
    violations: list[Any] = []
    for job in jobs:
        batch.lifecycle += job.batch.lifecycle
        batch.steps += job.batch.steps
        batch.samples += job.batch.samples
        batch.progress.update(job.batch.progress)
        batch.seq_high.update(job.batch.seq_high)
        for ingest_id, (tokens, joined) in job.batch.finish_updates.items():
            batch.update_finish(ingest_id, tokens, joined)
        decisions += job.decisions
        violations += job.violations
    last = jobs[-1]
    return CommitJob(batch, last.next_ingest_id, decisions, violations, last.applied_through)


@dataclass
class WriterTask:
    """Work that must run on the writer between two transactions (retention's deletes):
    `wait` returns once it ran, raising its failure."""

    work: Callable[[], None]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class GroupCommitter:
    """The one thread that commits acknowledged batches, in submission order.

    After a failed commit every later job fails with the same error: the memory that
    produced them ran ahead of the database, and only a restart from it is consistent.
    """

    def __init__(
        self,
        commit: CommitFn,
        *,
        max_group_rows: int = 100_000,
        on_failure: Callable[[BaseException], None] | None = None,
        maintain: Callable[[], object] | None = None,
        maintain_every_s: float = 5.0,
    ) -> None:
        """`maintain` runs on this thread between transactions every `maintain_every_s`
        and once at `close` (the store's compaction); its failures are logged, not fatal:
        it only tidies what is already durable."""
        self._commit = commit
        self._maintain = maintain
        self._maintain_every_s = maintain_every_s
        self._maintained_at = time.monotonic()
        self._max_group_rows = max_group_rows
        self._on_failure = on_failure
        self._queue: queue.SimpleQueue[CommitJob | WriterTask | None] = queue.SimpleQueue()
        self.failed: BaseException | None = None
        #: transactions committed and jobs they held, for the benchmark and /metrics
        self.transactions = 0
        self.jobs = 0
        #: seconds spent in transactions (busy / wall time: how close commits are to the
        #: ingest rate's limit)
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def submit(
        self,
        batch: EventBatch,
        next_ingest_id: int,
        decisions: Sequence[Any],
        violations: Sequence[Any],
        applied_through: int,
    ) -> CommitJob:
        """Queue a batch; the caller decides when to `wait` (outside its lock)."""
        job = CommitJob(batch, next_ingest_id, decisions, violations, applied_through)
        if not self._thread.is_alive():
            job.error = RuntimeError("the group committer is closed")
            job.done.set()
            return job
        self._queue.put(job)
        return job

    def run_between(self, work: Callable[[], None]) -> None:
        """Run `work` on this thread after the batches queued before it and before those
        queued after (so it never shares or splits a transaction); wait for it. Batches
        that arrive meanwhile wait for it: keep it short."""
        task = WriterTask(work)
        if not self._thread.is_alive():
            raise RuntimeError("the group committer is closed")
        self._queue.put(task)
        task.wait()

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            if self.failed is None:
                self._tidy()
            self._refuse_tasks()

    def _refuse_tasks(self) -> None:
        """Writer tasks queued after `close` are told so instead of waiting forever."""
        while True:
            try:
                left = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(left, WriterTask):
                left.error = RuntimeError("the group committer is closed")
                left.done.set()

    def _tidy(self) -> None:
        self._maintained_at = time.monotonic()
        if self._maintain is None:
            return
        try:
            self._maintain()
        except Exception:  # what it tidies is already durable: try again next time
            log.warning("store maintenance failed; retried later", exc_info=True)

    def _serve(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            if isinstance(first, WriterTask):
                self._run_task(first)
                continue
            group = [first]
            rows = first.rows()
            task: WriterTask | None = None
            while rows < self._max_group_rows:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                if isinstance(job, WriterTask):  # after this group, before the next
                    task = job
                    break
                group.append(job)
                rows += job.rows()
            self._write(group)
            if task is not None:
                self._run_task(task)
            if time.monotonic() - self._maintained_at >= self._maintain_every_s:
                self._tidy()

    def _run_task(self, task: WriterTask) -> None:
        """A writer task's failure is its caller's (it changed nothing durable); it does
        not fail the batches around it."""
        try:
            if self.failed is not None:
                raise RuntimeError("the group committer failed; writer tasks are refused")
            task.work()
        except BaseException as error:
            task.error = error
        finally:
            task.done.set()

    def _write(self, group: list[CommitJob]) -> None:
        if self.failed is None:
            whole = merge(group)
            started = time.perf_counter()
            try:
                self._commit(
                    whole.batch,
                    whole.next_ingest_id,
                    whole.decisions,
                    whole.violations,
                    whole.applied_through,
                )
                self.transactions += 1
                self.jobs += len(group)
                self.busy_s += time.perf_counter() - started
            except BaseException as error:  # every job of the group, and all later, fail
                self.failed = error
                if self._on_failure is not None:
                    self._on_failure(error)
        for job in group:
            job.error = self.failed
            job.done.set()
