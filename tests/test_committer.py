"""The group committer: batches are written in order, merged only when they queue up,
acknowledged only after their transaction, and nothing after a failed commit is taken."""

from __future__ import annotations

import threading

import pytest

from shadow.service.ingest.committer import GroupCommitter, merge
from shadow.service.store import EventBatch


def _batch(tag: int, generated: int) -> EventBatch:
    batch = EventBatch()
    batch.steps.append((tag,))
    batch.progress[("f", "r1")] = ("f", "r1", generated, float(tag), tag)
    batch.seq_high[("f", "src")] = tag
    return batch


class Recorder:
    """A commit function that can be held (to let jobs queue up) or made to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, dict, dict, list, list, int, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_on: int | None = None

    def __call__(self, batch, next_id, decisions, violations, through) -> None:
        self.entered.set()
        self.gate.wait()
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise OSError("No space left on device")
        self.calls.append((list(batch.steps), dict(batch.progress), dict(batch.seq_high),
                           list(decisions), list(violations), next_id, through))  # fmt: skip


def test_jobs_that_queue_up_share_one_transaction_in_order():
    recorder = Recorder()
    committer = GroupCommitter(recorder)
    recorder.gate.clear()
    first = committer.submit(_batch(1, 10), 2, ["d1"], [], 1)
    assert recorder.entered.wait(5)
    queued = [committer.submit(_batch(n, 10 * n), n + 1, [f"d{n}"], [f"v{n}"], n)
              for n in (2, 3, 4)]  # fmt: skip
    assert not first.done.is_set() and not any(job.done.is_set() for job in queued)
    recorder.gate.set()
    for job in (first, *queued):
        job.wait()
    committer.close()
    assert len(recorder.calls) == 2  # the first alone, the three queued behind it together
    steps, progress, seq_high, decisions, violations, next_id, through = recorder.calls[1]
    assert steps == [(2,), (3,), (4,)]
    assert progress == {("f", "r1"): ("f", "r1", 40, 4.0, 4)}  # the latest wins
    assert seq_high == {("f", "src"): 4}
    assert decisions == ["d2", "d3", "d4"] and violations == ["v2", "v3", "v4"]
    assert (next_id, through) == (5, 4)  # the counters of the last job
    assert (committer.transactions, committer.jobs) == (2, 4)


def test_a_failed_commit_fails_its_group_and_everything_after():
    recorder = Recorder()
    recorder.fail_on = 1
    failures: list[BaseException] = []
    committer = GroupCommitter(recorder, on_failure=failures.append)
    committer.submit(_batch(1, 1), 2, [], [], 1).wait()
    failed = committer.submit(_batch(2, 2), 3, [], [], 2)
    with pytest.raises(OSError, match="No space left"):
        failed.wait()
    later = committer.submit(_batch(3, 3), 4, [], [], 3)
    with pytest.raises(OSError):
        later.wait()
    committer.close()
    assert len(recorder.calls) == 1 and len(failures) == 1


def test_close_commits_what_is_queued_and_then_refuses():
    recorder = Recorder()
    committer = GroupCommitter(recorder)
    recorder.gate.clear()
    jobs = [committer.submit(_batch(n, n), n + 1, [], [], n) for n in range(1, 6)]
    closing = threading.Thread(target=committer.close)
    closing.start()
    recorder.gate.set()
    closing.join(10)
    assert all(job.done.is_set() and job.error is None for job in jobs)
    assert [step for call in recorder.calls for step in call[0]] == [(n,) for n in range(1, 6)]
    with pytest.raises(RuntimeError, match="closed"):
        committer.submit(_batch(9, 9), 10, [], [], 9).wait()


def test_merge_of_one_job_is_that_job():
    recorder = Recorder()
    committer = GroupCommitter(recorder)
    job = committer.submit(_batch(1, 1), 2, [], [], 1)
    job.wait()
    committer.close()
    assert merge([job]) is job


def test_maintenance_runs_between_transactions_and_at_close_and_never_fails_a_commit():
    recorder = Recorder()
    runs: list[int] = []

    def maintain() -> None:
        runs.append(len(recorder.calls))
        if len(runs) == 1:
            raise OSError("compaction hit a full disk")  # logged, retried later

    committer = GroupCommitter(recorder, maintain=maintain, maintain_every_s=0.0)
    for n in range(1, 4):
        committer.submit(_batch(n, n), n + 1, [], [], n).wait()
    committer.close()
    assert runs[:3] == [1, 2, 3] and len(runs) == 4  # after each transaction, and at close
    assert committer.failed is None and len(recorder.calls) == 3


def test_progress_log_folds_into_latest_and_readers_see_both(tmp_path):
    from shadow.service.store import LATEST_PROGRESS, ServiceStore

    store = ServiceStore(tmp_path / "p.duckdb")
    try:
        for generated, ingest_id in ((5, 1), (9, 2)):
            batch = EventBatch()
            batch.progress[("f", "r1")] = ("f", "r1", generated, float(ingest_id), ingest_id)
            store.commit(batch, ingest_id + 1, [], [], ingest_id)
        latest = f"SELECT request_id, generated, ingest_id FROM {LATEST_PROGRESS}"
        assert store.query(latest) == [{"request_id": "r1", "generated": 9, "ingest_id": 2}]
        assert store.compact_progress() == 2
        assert store.query("SELECT count(*) AS n FROM progress_log") == [{"n": 0}]
        stale = EventBatch()  # a lower value in the log never lowers the folded one
        stale.progress[("f", "r1")] = ("f", "r1", 3, 3.0, 3)
        store.commit(stale, 4, [], [], 3)
        store.compact_progress()
        assert store.query(latest) == [{"request_id": "r1", "generated": 9, "ingest_id": 2}]
        assert store.query("SELECT generated FROM progress_latest") == [{"generated": 9}]
    finally:
        store.close()


def test_a_writer_task_runs_between_the_batches_around_it_and_fails_alone():
    """Retention's deletes: a task queued between batches never joins or splits a group
    (the batches before it commit first, those after it next), and its failure is its
    caller's, not the ingest's."""
    recorder = Recorder()
    committer = GroupCommitter(recorder)
    recorder.gate.clear()
    first = committer.submit(_batch(1, 10), 2, [], [], 1)
    assert recorder.entered.wait(5)
    before = committer.submit(_batch(2, 20), 3, [], [], 2)
    seen: list[int] = []
    task = threading.Thread(target=committer.run_between, args=(lambda: seen.append(
        len(recorder.calls)),))  # fmt: skip
    task.start()
    while committer._queue.qsize() < 2:  # the task is queued behind the second batch
        threading.Event().wait(0.01)
    after = committer.submit(_batch(3, 30), 4, [], [], 3)
    recorder.gate.set()
    for job in (first, before, after):
        job.wait()
    task.join()
    assert seen == [2]  # after the first two transactions, before the third
    assert [call[0] for call in recorder.calls] == [[(1,)], [(2,)], [(3,)]]

    def broken() -> None:
        raise OSError("cannot write the archive")

    with pytest.raises(OSError, match="cannot write the archive"):
        committer.run_between(broken)
    committer.submit(_batch(4, 40), 5, [], [], 4).wait()  # ingest goes on
    assert committer.failed is None
    committer.close()
    with pytest.raises(RuntimeError, match="closed"):
        committer.run_between(lambda: None)
