"""A fleet's events are released up to its slowest live source, not past it: the stall
that queues the engines' steps ahead of the tap's dispatches must not read as drift.

The pipeline runs on a real DuckDB file; `SourceClocks` alone takes its times as arguments."""

from __future__ import annotations

import json
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow.events import parse_ndjson
from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
from shadow.service.ingest.source_clocks import SourceClocks
from shadow.service.store import ServiceStore


def clocks(wait_s: float = 3.0, max_lag_s: float = 30.0) -> SourceClocks:
    return SourceClocks(window_s=2.0, wait_s=wait_s, max_lag_s=max_lag_s, gap_s=1.0)


def test_a_live_source_behind_holds_its_fleet_and_only_its_fleet():
    c = clocks()
    c.batch(100.0)
    c.saw("a", "tap", 5.0, 100.0)
    c.saw("a", "engines", 20.0, 100.0)
    c.saw("b", "engines", 50.0, 100.0)
    assert c.release_points(100.5) == {"a": 3.0, "b": 48.0}
    c.saw("a", "tap", 19.0, 100.6)
    assert c.release_points(100.6) == {"a": 17.0, "b": 48.0}


def test_a_quiet_source_holds_for_wait_s_after_its_last_post():
    c = clocks(wait_s=3.0)
    for now in (100.0, 100.5, 101.0, 101.5, 102.0, 102.5, 103.0, 103.5):  # engines post on
        c.batch(now)
        c.saw("a", "engines", 20.0 + now - 100.0, now)
        if now == 100.0:
            c.saw("a", "tap", 5.0, now)
    assert c.release_points(102.9)["a"] == 3.0
    assert c.release_points(103.5)["a"] == pytest.approx(21.5)  # the tap went quiet: newest - 2


def test_a_gap_in_ingest_gives_every_source_its_wait_again():
    """After a stall the first batch in may be any source's: the others, silent through
    the stall like quiet ones, are waited for again."""
    c = clocks(wait_s=3.0)
    c.batch(100.0)
    c.saw("a", "tap", 5.0, 100.0)
    c.saw("a", "engines", 5.0, 100.0)
    c.batch(115.0)  # 15 s with no batch
    c.saw("a", "engines", 20.0, 115.0)
    assert c.release_points(115.0)["a"] == 3.0
    assert c.release_points(118.1)["a"] == 18.0  # its wait is over


def test_a_source_far_behind_is_not_waited_for_and_a_stopped_one_is_forgotten():
    c = clocks(wait_s=3.0, max_lag_s=30.0)
    c.batch(100.0)
    c.saw("a", "old-plugin", 5.0, 100.0)
    c.saw("a", "engines", 40.0, 100.0)
    assert c.release_points(100.1)["a"] == 38.0  # 35 s behind: past max_lag_s
    assert c.release_points(104.0)["a"] == 38.0
    c.saw("a", "old-plugin", 39.0, 104.5)  # a name that posts again is waited for again
    assert c.release_points(104.5)["a"] == 37.0


def test_a_fleet_gone_quiet_is_released_by_the_time_of_the_others():
    """No live source: the rule before (the newest event anywhere, less the window), so
    its last events are not held while another fleet keeps the service busy."""
    c = clocks(wait_s=3.0)
    c.batch(100.0)
    c.saw("quiet", "router", 50.0, 100.0)
    c.saw("busy", "engines", 50.0, 100.0)
    assert c.release_points(101.0) == {"quiet": 48.0, "busy": 48.0}
    for now in (100.5, 101.0, 101.5, 102.0, 102.5, 103.0, 103.5, 104.0):  # no gap
        c.batch(now)
        c.saw("busy", "engines", 50.0 + now - 100.0, now)
    assert c.release_points(104.0) == {"quiet": 52.0, "busy": 52.0}
    assert c.release_points(104.0, window_s=0.0)["quiet"] == 54.0  # the idle flush: all


# -- through the pipeline -------------------------------------------------------------


def send(pipeline: Pipeline, source: str, events: list[dict]) -> None:
    for seq, event in enumerate(events, start=send.seqs.get(source, 0)):
        event.setdefault("source", source)
        event.setdefault("seq", seq)
    send.seqs[source] = send.seqs.get(source, 0) + len(events)
    parsed, errors = parse_ndjson("\n".join(json.dumps(e) for e in events))
    assert not errors, errors
    pipeline.submit(parsed)


send.seqs = {}


@pytest.fixture
def open_pipeline(tmp_path):
    opened: list[Pipeline] = []

    def make(**config) -> Pipeline:
        send.seqs.clear()
        store = ServiceStore(tmp_path / f"clocks-{len(opened)}.duckdb")
        pipeline = Pipeline(store, PipelineConfig(windows_enabled=False, **config))
        pipeline.start()
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()
        pipeline.store.close()


def stalled_stream(pipeline: Pipeline) -> list[dict]:
    """The tap announced the worker; then a stall, after which the engines' 15 s of steps
    (4 running) are taken before the tap's dispatches and progress of the same seconds."""
    send(pipeline, "tap", [{"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 8}])
    steps = [
        {"type": "engine_step", "ts": round(1.1 + 0.1 * k, 3), "worker": "w0", "step": k,
         "duration_ms": 100.0, "running": 4}
        for k in range(150)
    ]  # fmt: skip
    send(pipeline, "engines", steps)
    tap: list[dict] = []
    for r in range(4):
        tap.append({"type": "ready", "ts": 1.0, "request_id": f"r{r}", "prompt_tokens": 50})
        tap.append({"type": "dispatch", "ts": 1.0, "request_id": f"r{r}", "worker": "w0"})
    for k in range(1, 16):
        tap += [
            {"type": "progress", "ts": 1.0 + k, "request_id": f"r{r}", "generated": 10 * k}
            for r in range(4)
        ]
    send(pipeline, "tap", tap)
    pipeline.drain()
    return pipeline.store.query("SELECT kind, detail FROM violations")


def test_the_engines_backlog_first_is_applied_in_event_time_with_no_drift(open_pipeline):
    pipeline = open_pipeline(source_wait_s=30.0)  # the tap is live throughout, however slow
    violations = stalled_stream(pipeline)
    assert violations == []
    assert pipeline.fleets["default"].late_events == 0


def test_without_the_wait_the_same_stream_reads_as_drift(open_pipeline):
    """The rule before source clocks (the window behind the newest event alone): the
    steps run ahead of the dispatches, which come late, and the check reports drift."""
    pipeline = open_pipeline(source_wait_s=0.0)
    violations = stalled_stream(pipeline)
    assert [v["kind"] for v in violations] == ["engine_drift"], violations
    assert "mirror has 0 active, engine reports 4 running" in violations[0]["detail"]
    state = pipeline.fleets["default"]
    assert state.late_events > 0
    # all of them the tap's: its dispatches and progress, behind the engines' steps
    assert {source for source, _ in state.late_by_source} == {"tap"}
    assert {"dispatch", "progress"} <= {kind for _, kind in state.late_by_source}


def idle_steps(count: int) -> list[dict]:
    """Worker w0's steps at 1, 2, ... s, running nothing."""
    return [
        {"type": "engine_step", "ts": 1.0 + k, "worker": "w0", "step": k, "duration_ms": 50.0,
         "running": 0}
        for k in range(count)
    ]  # fmt: skip


def test_a_quiet_source_stops_holding_the_fleet(open_pipeline):
    pipeline = open_pipeline(source_wait_s=0.2)
    send(pipeline, "tap", [{"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 8}])
    time.sleep(0.3)
    send(pipeline, "engines", idle_steps(10))
    assert pipeline.fleets["default"].mirror.workers["w0"].steps == 8  # up to 10.0 - 2


def test_a_quiet_fleet_beside_a_busy_one_is_applied(open_pipeline):
    """The UI test's case: a fleet that posted once, beside the demo's fleet posting on."""
    pipeline = open_pipeline(source_wait_s=0.2)
    send(pipeline, "once", [{"type": "worker", "ts": 5.0, "worker": "x", "capacity": 4,
                             "fleet": "xss"}])  # fmt: skip
    for k in range(4):
        send(
            pipeline, "engines", [{"type": "worker", "ts": 5.0 + k, "worker": "w0", "capacity": 8}]
        )
        time.sleep(0.1)
    assert "x" in pipeline.fleets["xss"].mirror.workers


def test_the_idle_flush_applies_only_as_far_as_the_live_sources_got(open_pipeline):
    """A stream quiet for a moment may be a stalled one: the idle flush applies each
    fleet up to its slowest live source's time (not less the window), and all of it once
    the sources' waits are over."""
    pipeline = open_pipeline(source_wait_s=2.0)
    announced = [
        {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 8},
        {"type": "ready", "ts": 3.0, "request_id": "r", "prompt_tokens": 5},
    ]
    send(pipeline, "tap", announced)
    send(pipeline, "engines", idle_steps(10))
    pipeline.drain(wait_for_sources=True)
    assert pipeline.fleets["default"].mirror.workers["w0"].steps == 3  # steps at 1, 2, 3
    time.sleep(2.1)
    pipeline.drain(wait_for_sources=True)
    assert pipeline.fleets["default"].mirror.workers["w0"].steps == 10


def fleet_streams(requests: int, seed: int) -> dict[str, list[dict]]:
    """A small fleet's true stream, split by source, each in time order: the tap's
    lifecycle and progress, the engines' steps (the running counts the fleet really had)."""
    rng = random.Random(seed)
    tap: list[dict] = [
        {"type": "worker", "ts": 0.0, "worker": w, "capacity": 4} for w in ("w0", "w1")
    ]
    spans: list[tuple[str, float, float]] = []
    for r in range(requests):
        start = round(0.5 + rng.random() * 6, 1)
        end = round(start + 0.5 + rng.random() * 5, 1)
        worker = f"w{r % 2}"
        spans.append((worker, start, end))
        tap.append({"type": "ready", "ts": start, "request_id": f"r{r}", "prompt_tokens": 20})
        tap.append({"type": "dispatch", "ts": start, "request_id": f"r{r}", "worker": worker})
        tap.append({"type": "progress", "ts": round((start + end) / 2, 2), "request_id": f"r{r}",
                    "generated": 5})  # fmt: skip
        tap.append({"type": "finish", "ts": end, "request_id": f"r{r}", "output_tokens": 10,
                    "reason": "length"})  # fmt: skip
    tap.sort(key=lambda e: e["ts"])
    steps = []
    for k in range(1, 130):
        ts = round(0.05 + 0.1 * k, 2)
        for worker in ("w0", "w1"):
            running = sum(1 for w, a, b in spans if w == worker and a < ts <= b)
            steps.append({"type": "engine_step", "ts": ts, "worker": worker, "step": k,
                          "duration_ms": 100.0, "running": running})  # fmt: skip
    return {"tap": tap, "engines": steps}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    requests=st.integers(1, 8),
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.tuples(st.sampled_from(["tap", "engines"]), st.integers(1, 60)),
                  min_size=1, max_size=30),
)  # fmt: skip
def test_sources_delayed_any_amount_against_each_other_apply_in_event_time(
    open_pipeline, requests, seed, cuts
):
    """Each source posts in order, in batches of any size, one source any amount ahead
    of the other once both are known: every event is applied in event time (none late),
    the drift check sees the fleet as it was (no violation) and the mirror ends with
    every request finished."""
    pipeline = open_pipeline(source_wait_s=60.0)
    streams = fleet_streams(requests, seed)
    sent = dict.fromkeys(streams, 0)
    # each source posts once first: one the service has never heard from cannot be waited
    # for (a real tap announces its workers when it starts)
    for source, size in [("tap", 1), ("engines", 1), *cuts, ("tap", 10**6), ("engines", 10**6)]:
        batch = streams[source][sent[source] : sent[source] + size]
        if batch:
            send(pipeline, source, [dict(e) for e in batch])
            sent[source] += len(batch)
    pipeline.drain()
    state = pipeline.fleets["default"]
    assert state.late_events == 0
    assert pipeline.store.query("SELECT kind, detail FROM violations") == []
    assert all(not w.active for w in state.mirror.order)
    assert state.mirror.workers["w0"].steps == 129


def test_late_events_are_counted_by_source_in_metrics_and_the_snapshot(tmp_path):
    """With no wait (the rule before), the tap's dispatches behind the engines' steps
    come late: /metrics and the snapshot name the tap and the kinds."""
    from prometheus_client.parser import text_string_to_metric_families

    from shadow.service.http.app import create_app
    from shadow.service.settings import load_settings
    from tests.service_helpers import served

    settings = load_settings(None, db=tmp_path / "late.duckdb", workers_processes=False,
                             windows=False, ingest={"source_wait_s": 0.0})  # fmt: skip

    def body(source: str, events: list[dict]) -> str:
        return "\n".join(json.dumps(e | {"source": source, "seq": k}) for k, e in enumerate(events))

    worker = [{"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 8}]
    dispatches = [
        {"type": "dispatch", "ts": 1.0 + r / 10, "request_id": f"r{r}", "worker": "w0"}
        for r in range(4)
    ]
    readies = [
        {"type": "ready", "ts": 1.0, "request_id": f"r{r}", "prompt_tokens": 5} for r in range(4)
    ]
    with served(create_app(settings)) as client:
        assert client.post("/v1/events", content=body("tap", worker)).status_code == 200
        assert client.post("/v1/events", content=body("engines", idle_steps(10))).status_code == 200
        late = body("router", readies + dispatches)
        assert client.post("/v1/events", content=late).status_code == 200
        client.post("/v1/flush")
        text = client.get("/metrics").text
        snapshot = client.get("/v1/fleets/default/snapshot").json()
    found = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "shadow_late_events_total"
    }
    fleet = ("fleet", "default")
    # every sender, 0 for those on time
    assert found == {
        (fleet, ("source", "engines")): 0,
        (fleet, ("source", "router")): 8,
        (fleet, ("source", "tap")): 0,
    }
    assert snapshot["late_events"] == 8
    assert snapshot["late_by_source"] == [
        {"source": "router", "type": "dispatch", "events": 4},
        {"source": "router", "type": "ready", "events": 4},
    ]
