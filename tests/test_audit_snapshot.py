"""What the audit stores of a dispatch's frozen snapshot: JSON bytes, compressed when large
(migration 0015), and read back as the same snapshot."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from shadow.policies import FleetSnapshot
from shadow.policies.snapshot import ActiveSet
from shadow.stream.audit import AuditJob, Auditor
from shadow.stream.stored_snapshot import COMPRESS_OVER as SNAPSHOT_COMPRESS_OVER
from shadow.stream.stored_snapshot import unpack as stored_snapshot


def _audited(workers: int) -> tuple[FleetSnapshot, bytes]:
    """One dispatch on a fleet of `workers` (B = 8, each running 1-7 requests)."""
    rng = np.random.default_rng(workers)
    running = rng.integers(1, 8, workers)
    worker = np.repeat(np.arange(workers), running)
    active = ActiveSet.from_arrays(
        worker, rng.integers(10, 4000, worker.size), rng.integers(0, 900, worker.size)
    )
    names = [str(w) for w in range(workers)]
    snapshot = FleetSnapshot.from_active([8] * workers, active, worker_ids=names)
    job = AuditJob(1, "f", 0.0, "r1", 300, 0, "0", "jsq", None, snapshot)
    outcome = Auditor("f").audit(job)
    stored = [d.snapshot_z for d in outcome.decisions]
    assert stored[0] is not None and stored[1:] == [None] * (len(stored) - 1)
    return snapshot, stored[0]


@pytest.mark.parametrize("workers", [8, 256])
def test_the_stored_snapshot_reads_back_as_the_frozen_one(workers: int) -> None:
    snapshot, stored = _audited(workers)
    read = stored_snapshot(stored)
    assert read["loads"] == snapshot.load.tolist()
    assert read["active"] == snapshot.active_count.tolist()
    assert read["workers"] == [str(w) for w in snapshot.worker_ids]
    assert len(read["f_brh"]) == workers


def test_a_small_fleets_snapshot_is_stored_as_json_and_a_large_ones_compressed() -> None:
    _, small = _audited(8)
    _, large = _audited(256)
    assert small[:1] == b"{" and len(small) <= SNAPSHOT_COMPRESS_OVER
    assert large[:1] == b"\x78"
    assert len(zlib.decompress(large)) > SNAPSHOT_COMPRESS_OVER
    assert len(large) < len(zlib.decompress(large)) / 2
