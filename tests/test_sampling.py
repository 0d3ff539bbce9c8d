"""The audit's sampler: every dispatch while the audit keeps up; an even, counted
sample while it falls behind, with no worker and no stretch of time left out."""

from __future__ import annotations

import pytest

from shadow.stream.sampling import AuditSampler


def test_it_keeps_every_dispatch_while_the_audit_keeps_up():
    sampler = AuditSampler()
    sampler.adapt(backlog=0, high=8)
    assert all(sampler.keep() for _ in range(1000))
    assert (sampler.audited, sampler.skipped, sampler.stride) == (1000, 0, 1)


def test_behind_it_audits_one_in_every_block_and_counts_the_rest():
    sampler = AuditSampler(max_stride=16, seed=3)
    for _ in range(3):
        sampler.adapt(backlog=8, high=8)  # 1 -> 2 -> 4 -> 8
    sampler.adapt(backlog=20, high=8)  # 16, the most
    sampler.adapt(backlog=20, high=8)
    kept = [sampler.keep() for _ in range(16 * 200)]
    assert sampler.stride == 16
    # even in time: exactly one audited dispatch in every block of 16
    assert all(sum(kept[i : i + 16]) == 1 for i in range(0, len(kept), 16))
    assert (sampler.audited, sampler.skipped) == (200, 16 * 200 - 200)
    assert sampler.sampled_share == pytest.approx(1 / 16)


def test_a_round_robin_incumbent_leaves_no_worker_unaudited():
    """With the stride equal to the fleet size, "every 16th dispatch" would audit one
    worker of a round-robin incumbent only; a random position per block audits all."""
    workers = 16
    sampler = AuditSampler(max_stride=workers, seed=1)
    for _ in range(4):
        sampler.adapt(backlog=10, high=2)
    audited_workers = {n % workers for n in range(workers * 400) if sampler.keep()}
    assert audited_workers == set(range(workers))


def test_it_returns_to_every_dispatch_when_the_backlog_drains():
    sampler = AuditSampler(max_stride=8)
    for _ in range(3):
        sampler.adapt(backlog=9, high=4)
    [sampler.keep() for _ in range(8)]
    for _ in range(3):
        sampler.adapt(backlog=1, high=4)
    [sampler.keep() for _ in range(8)]  # the stride changes only at a block boundary
    assert sampler.stride == 1
    assert all(sampler.keep() for _ in range(50))


def test_a_stride_below_one_is_refused():
    with pytest.raises(ValueError, match="max_stride"):
        AuditSampler(max_stride=0)
