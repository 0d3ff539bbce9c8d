"""Injected faults each produce exactly the expected violation, once."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from shadow.events import parse_ndjson
from shadow.service.ingest.pipeline import Limits, Pipeline, PipelineConfig
from shadow.service.store import ServiceStore
from shadow.stream.audit import AuditFollower
from shadow.stream.items import decode_stream


@pytest.fixture
def pipeline(tmp_path):
    store = ServiceStore(tmp_path / "faults.duckdb")
    pipeline = Pipeline(store, PipelineConfig(windows_enabled=False))
    pipeline.start()
    yield pipeline
    store.close()


def send(pipeline: Pipeline, *events: dict) -> None:
    body = "\n".join(json.dumps(e) for e in events)
    parsed, errors = parse_ndjson(body)
    assert not errors, errors
    pipeline.submit(parsed)
    pipeline.drain()


def fleet(capacity: int = 2) -> list[dict]:
    return [
        {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": capacity},
        {"type": "worker", "ts": 0.0, "worker": "w1", "capacity": capacity},
    ]


def ready(rid: str, ts: float = 1.0) -> dict:
    return {"type": "ready", "ts": ts, "request_id": rid, "prompt_tokens": 100}


def dispatch(rid: str, worker: str, ts: float = 1.0, seq: int | None = None) -> dict:
    event = {"type": "dispatch", "ts": ts, "request_id": rid, "worker": worker, "policy": "jsq"}
    if seq is not None:
        event["seq"] = seq
    return event


def kinds(pipeline: Pipeline) -> list[str]:
    return [r["kind"] for r in pipeline.store.query("SELECT kind FROM violations ORDER BY ts")]


def test_a_clean_stream_has_no_violation(pipeline):
    send(
        pipeline,
        *fleet(),
        ready("r1"),
        dispatch("r1", "w0"),
        {"type": "progress", "ts": 2.0, "request_id": "r1", "generated": 5},
        {"type": "finish", "ts": 3.0, "request_id": "r1", "output_tokens": 9, "reason": "stop"},
    )
    assert kinds(pipeline) == []


def test_double_dispatch(pipeline):
    send(
        pipeline,
        *fleet(),
        ready("r1"),
        dispatch("r1", "w0", seq=1),
        dispatch("r1", "w1", ts=1.5, seq=2),
        dispatch("r1", "w1", ts=1.6, seq=3),
    )
    assert kinds(pipeline) == ["double_dispatch"]
    assert pipeline.fleets["default"].mirror.workers["w1"].active == {}


def test_dispatch_to_a_full_worker(pipeline):
    send(
        pipeline,
        *fleet(capacity=1),
        ready("r1"),
        ready("r2"),
        dispatch("r1", "w0"),
        dispatch("r2", "w0", ts=1.1),
    )
    rows = pipeline.store.query("SELECT kind, severity, worker, request_id FROM violations")
    assert rows == [
        {"kind": "over_capacity", "severity": "critical", "worker": "w0", "request_id": "r2"}
    ]


def test_a_request_that_never_finishes_is_a_ghost_released_after_the_ttl(pipeline):
    send(
        pipeline,
        *fleet(),
        ready("r1"),
        dispatch("r1", "w0"),
        {"type": "progress", "ts": 5.0, "request_id": "r1", "generated": 3},
    )
    assert kinds(pipeline) == []
    send(pipeline, ready("later", ts=200.0), ready("much-later", ts=300.0))
    assert kinds(pipeline) == ["ghost"]
    assert pipeline.fleets["default"].mirror.workers["w0"].active == {}


def test_decreasing_progress(pipeline):
    send(
        pipeline,
        *fleet(),
        ready("r1"),
        dispatch("r1", "w0"),
        {"type": "progress", "ts": 2.0, "request_id": "r1", "generated": 10},
        {"type": "progress", "ts": 3.0, "request_id": "r1", "generated": 4},
        {"type": "progress", "ts": 4.0, "request_id": "r1", "generated": 2},
    )
    assert kinds(pipeline) == ["progress_decreased"]


def test_progress_after_finish(pipeline):
    send(
        pipeline,
        *fleet(),
        ready("r1"),
        dispatch("r1", "w0"),
        {"type": "finish", "ts": 3.0, "request_id": "r1", "output_tokens": 10, "reason": "stop"},
        {"type": "progress", "ts": 4.0, "request_id": "r1", "generated": 20},
    )
    assert kinds(pipeline) == ["progress_after_finish"]


def test_dispatch_of_a_request_never_ready(pipeline):
    send(pipeline, *fleet(), dispatch("ghost-request", "w1"))
    assert kinds(pipeline) == ["dispatch_without_ready"]


def test_out_of_order_events_within_the_window_are_applied_in_order(pipeline):
    # The dispatch arrives before its ready; within the reorder window that is no fault.
    send(pipeline, *fleet(), dispatch("r1", "w0", ts=1.2), ready("r1", ts=1.0))
    assert kinds(pipeline) == []
    assert "r1" in pipeline.fleets["default"].mirror.workers["w0"].active


class SlowAuditWorker(ThreadPoolExecutor):
    """The audit worker process, stand-in: its own follower, slower than ingest."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.follower = AuditFollower()

    def submit(self, fn, stream):
        def audit():
            time.sleep(0.02)
            return self.follower.run(decode_stream(stream))

        return super().submit(audit)


def test_a_slow_audit_worker_holds_ingest_back_at_max_audit_backlog(tmp_path):
    """The backlog handed to the audit worker stays within its bound (ingest waits for the
    oldest batch instead), the waits are counted, and every dispatch is still audited."""
    store = ServiceStore(tmp_path / "backlog.duckdb")
    config = PipelineConfig(windows_enabled=False, limits=Limits(max_audit_backlog=2))
    worker = SlowAuditWorker()
    pipeline = Pipeline(store, config, audit_executor=worker)
    pipeline.start()
    backlogs = []
    for i in range(12):
        rid = f"r{i}"
        body = "\n".join(json.dumps(e) for e in [
            *(fleet() if i == 0 else []),
            ready(rid, ts=1.0 + i),
            dispatch(rid, "w0" if i % 2 else "w1", ts=1.0 + i),
            {"type": "finish", "ts": 1.5 + i, "request_id": rid, "output_tokens": 3,
             "reason": "stop"},
        ])  # fmt: skip
        pipeline.submit(parse_ndjson(body)[0])
        backlogs.append(pipeline.audit_backlog)
    pipeline.drain()
    assert max(backlogs) == 2
    assert pipeline.bound_hits["audit_backlog"] > 0
    audited = store.query("SELECT count(DISTINCT request_id) AS n FROM decisions")[0]["n"]
    assert audited == 12
    store.close()
    worker.shutdown()


def test_the_audit_replica_skips_the_checks_and_keeps_the_same_state(pipeline):
    """The audit follower's replica reports nothing (the ingest path's core does), yet
    ends in the ingest mirror's state through every fault: its skipped checks only read
    the mirror, and its ghost sweeps, which release requests, still run."""
    from tests.test_mirror_stateful import picture

    step = {"type": "engine_step", "ts": 2.0, "worker": "w0", "step": 1,
            "duration_ms": 20.0, "running": 9, "kv_tokens": 500}  # fmt: skip
    send(
        pipeline,
        *fleet(capacity=1),
        ready("r1"),
        ready("r2"),
        dispatch("r1", "w0"),
        dispatch("r2", "w0", ts=1.1),  # over capacity
        dispatch("r1", "w1", ts=1.2),  # double dispatch
        dispatch("never-ready", "w1", ts=1.3),
        step,  # the engine runs 9 where the mirror has 2
        {"type": "progress", "ts": 2.5, "request_id": "r1", "generated": 10},
        {"type": "progress", "ts": 3.0, "request_id": "r1", "generated": 4},  # decreased
        {"type": "finish", "ts": 4.0, "request_id": "r2", "output_tokens": 3, "reason": "stop"},
        {"type": "progress", "ts": 5.0, "request_id": "r2", "generated": 20},  # after finish
    )
    send(pipeline, ready("later", ts=200.0), ready("much-later", ts=300.0))  # r1: a ghost
    reported = set(kinds(pipeline))
    assert {"over_capacity", "double_dispatch", "dispatch_without_ready", "progress_decreased",
            "progress_after_finish", "ghost"} <= reported  # fmt: skip
    follower = pipeline._audits._follower
    assert follower is not None
    replica = follower.fleets["default"][0]
    assert replica.checks is False and pipeline.fleets["default"].core.checks is True
    assert replica.checker.remembered == sum(1 for k in kinds(pipeline) if k == "ghost")
    assert picture(replica.mirror) == picture(pipeline.fleets["default"].mirror)
