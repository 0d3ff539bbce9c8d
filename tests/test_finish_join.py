"""The join of the tap's and the engine's finishes, corrections and `recomputed`, through
the real ingest path (the pipeline on a DuckDB file, and POST /v1/events on the app)."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shadow.events import parse_ndjson
from shadow.service.http.app import create_app
from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
from shadow.service.settings import load_settings
from shadow.service.store import ServiceStore
from shadow.stream.fleet import FleetCore
from shadow.stream.join import reason_label
from tests.service_helpers import served


def open_pipeline(path) -> Pipeline:
    # these tests order events by their times and the reorder window alone: their sources
    # post once each, and the wait for a slow source has its own tests (test_source_clocks)
    config = PipelineConfig(windows_enabled=False, source_wait_s=0.0)
    pipeline = Pipeline(ServiceStore(path), config)
    pipeline.start()
    return pipeline


@pytest.fixture
def pipeline(tmp_path):
    pipeline = open_pipeline(tmp_path / "join.duckdb")
    yield pipeline
    pipeline.close()
    pipeline.store.close()


def send(pipeline: Pipeline, *events: dict, drain: bool = True) -> None:
    parsed, errors = parse_ndjson("\n".join(json.dumps(e) for e in events))
    assert not errors, errors
    pipeline.submit(parsed)
    if drain:
        pipeline.drain()


def started(*rids: str, worker: str = "w0") -> list[dict]:
    events: list[dict] = [
        {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 8},
        {"type": "worker", "ts": 0.0, "worker": "w1", "capacity": 8},
    ]
    for rid in rids:
        events.append({"type": "ready", "ts": 1.0, "request_id": rid, "prompt_tokens": 50})
        events.append({"type": "dispatch", "ts": 1.0, "request_id": rid, "worker": worker})
    return events


def tap_finish(rid: str, tokens: int, ts: float = 5.0, estimated: bool = True) -> dict:
    return {"type": "finish", "ts": ts, "request_id": rid, "output_tokens": tokens,
            "reason": "length", "estimated": estimated, "source": "tap"}  # fmt: skip


def engine_finish(rid: str, tokens: int, ts: float = 5.0) -> dict:
    return {"type": "finish", "ts": ts, "request_id": rid, "output_tokens": tokens,
            "reason": "length", "estimated": False, "from_engine": True,
            "source": "engine"}  # fmt: skip


def finish_rows(pipeline: Pipeline) -> dict[str, list[tuple]]:
    """source -> (request, output_tokens, joined_to source or None) of stored finishes."""
    rows = pipeline.store.query(
        "SELECT f.source, f.request_id, f.output_tokens, j.source AS joined FROM events f "
        "LEFT JOIN events j ON j.ingest_id = f.joined_to WHERE f.type = 'finish' "
        "ORDER BY f.ts, f.ingest_id"
    )
    out: dict[str, list[tuple]] = {}
    for row in rows:
        out.setdefault(row["source"], []).append(
            (row["request_id"], row["output_tokens"], row["joined"])
        )
    return out


def violations(pipeline: Pipeline) -> list[str]:
    return [r["kind"] for r in pipeline.store.query("SELECT kind FROM violations")]


def join_counts(pipeline: Pipeline) -> tuple[int, int, int]:
    join = pipeline.fleets["default"].core.join
    return join.estimates, join.corrections, join.unjoined


def test_an_exact_engine_count_corrects_the_taps_estimate(pipeline):
    send(pipeline, *started("a"), tap_finish("a", 12, ts=5.0))
    request = pipeline.fleets["default"].mirror.requests["a"]
    assert (request.finished, request.output_tokens, request.estimated) == (True, 12, True)
    assert len(pipeline.fleets["default"].mirror.workers["w0"].active) == 0
    send(pipeline, engine_finish("a", 17, ts=5.01))
    assert (request.output_tokens, request.estimated) == (17, False)
    # the tap's stored row now holds the exact count; the engine's points at it
    assert finish_rows(pipeline) == {"tap": [("a", 17, None)], "engine": [("a", 17, "tap")]}
    assert join_counts(pipeline) == (1, 1, 0)
    assert violations(pipeline) == []
    # the predictor learned the exact count, never the estimate
    predictor = pipeline.fleets["default"].mirror.predictor
    assert len(predictor) == 1 and predictor._counts[17] == 1


def test_engine_finish_first_then_the_taps_estimate_is_ignored(pipeline):
    send(pipeline, *started("a"), engine_finish("a", 17, ts=5.0))
    mirror = pipeline.fleets["default"].mirror
    assert len(mirror.workers["w0"].active) == 0  # the first finish releases the slot
    send(pipeline, tap_finish("a", 12, ts=5.02))
    assert mirror.requests["a"].output_tokens == 17
    assert finish_rows(pipeline) == {"engine": [("a", 17, None)], "tap": [("a", 12, "engine")]}
    assert join_counts(pipeline) == (0, 0, 0)
    assert violations(pipeline) == []


def test_a_later_count_after_an_exact_one_changes_nothing(pipeline):
    """First exact wins: the tap's usage count, then the engine's (even a different one)."""
    send(pipeline, *started("a"), tap_finish("a", 20, ts=5.0, estimated=False))
    send(pipeline, engine_finish("a", 21, ts=5.01), tap_finish("a", 3, ts=5.02))
    assert pipeline.fleets["default"].mirror.requests["a"].output_tokens == 20
    rows = finish_rows(pipeline)
    assert rows["tap"] == [("a", 20, None), ("a", 3, "tap")]
    assert rows["engine"] == [("a", 21, "tap")]
    assert join_counts(pipeline) == (0, 0, 0)


def test_engine_finishes_of_unseen_requests_are_unjoined_not_violations(pipeline):
    send(pipeline, *started("a"), engine_finish("elsewhere-1", 9), engine_finish("elsewhere-2", 4))
    assert join_counts(pipeline) == (0, 0, 2)
    assert violations(pipeline) == []
    # a tap's finish of a request never dispatched is still what it was: a violation
    send(pipeline, {**tap_finish("ghost", 3, ts=6.0), "estimated": None})
    assert violations(pipeline) == ["finish_unknown_request"]


def test_n_children_take_engine_finishes_by_finish_time_then_index(pipeline):
    kids = ["cmpl-x-0#0", "cmpl-x-0#1", "cmpl-x-0#2"]
    send(pipeline, *started(*kids))
    send(pipeline, tap_finish("cmpl-x-0#1", 5, ts=4.0), tap_finish("cmpl-x-0#0", 6, ts=4.5))
    # #2 has not finished at the tap yet: the engine's first two go to #1 then #0, the
    # third to #2 (finishing it), a fourth is a duplicate
    send(
        pipeline,
        engine_finish("cmpl-x-0", 8, ts=4.6),
        engine_finish("cmpl-x-0", 9, ts=4.7),
        engine_finish("cmpl-x-0", 10, ts=4.8),
        engine_finish("cmpl-x-0", 11, ts=4.9),
    )
    mirror = pipeline.fleets["default"].mirror
    assert [mirror.requests[k].output_tokens for k in kids] == [9, 8, 10]
    assert all(not mirror.requests[k].estimated for k in kids)
    assert len(mirror.workers["w0"].active) == 0
    assert finish_rows(pipeline)["tap"] == [("cmpl-x-0#1", 8, None), ("cmpl-x-0#0", 9, None)]
    assert join_counts(pipeline) == (2, 2, 0)
    assert violations(pipeline) == []


@pytest.mark.parametrize("engine_first_in_time", [True, False])
def test_out_of_order_within_the_reorder_window_joins_in_event_time(pipeline, engine_first_in_time):
    """The later-in-time finish is sent first; the reorder window (2 s) applies both in
    event time, so the earlier one finishes the request whichever arrived first."""
    send(pipeline, *started("a"), drain=False)
    tap_ts, engine_ts = (5.5, 5.0) if engine_first_in_time else (5.0, 5.5)
    first, second = (
        (tap_finish("a", 12, tap_ts), engine_finish("a", 17, engine_ts))
        if engine_first_in_time
        else (engine_finish("a", 17, engine_ts), tap_finish("a", 12, tap_ts))
    )
    send(pipeline, first, drain=False)
    send(pipeline, second, drain=False)
    assert pipeline.fleets["default"].mirror.requests["a"].finished is False  # still held
    pipeline.drain()
    rows = finish_rows(pipeline)
    if engine_first_in_time:
        assert rows == {"engine": [("a", 17, None)], "tap": [("a", 12, "engine")]}
        assert join_counts(pipeline) == (0, 0, 0)
    else:
        assert rows == {"tap": [("a", 17, None)], "engine": [("a", 17, "tap")]}
        assert join_counts(pipeline) == (1, 1, 0)
    assert pipeline.fleets["default"].mirror.requests["a"].output_tokens == 17
    assert violations(pipeline) == []


def test_a_restart_rebuilds_the_join_from_the_stored_rows(tmp_path):
    path = tmp_path / "restart.duckdb"
    pipeline = open_pipeline(path)
    send(pipeline, *started("a", "b"), tap_finish("a", 12), engine_finish("a", 17, ts=5.01))
    send(pipeline, engine_finish("b", 30), tap_finish("b", 29, ts=5.01))
    before = finish_rows(pipeline)
    pipeline.close()
    pipeline.store.close()
    again = open_pipeline(path)
    try:
        mirror = again.fleets["default"].mirror
        assert (mirror.requests["a"].output_tokens, mirror.requests["a"].estimated) == (17, False)
        assert mirror.requests["b"].output_tokens == 30
        assert join_counts(again) == (1, 1, 0)
        assert finish_rows(again) == before
        assert violations(again) == []
    finally:
        again.close()
        again.store.close()


def test_recomputed_returns_the_request_to_the_pool_for_a_new_dispatch(pipeline):
    send(
        pipeline,
        *started("a"),
        {"type": "progress", "ts": 2.0, "request_id": "a", "generated": 4, "estimated": True},
        {
            "type": "finish",
            "ts": 3.0,
            "request_id": "a",
            "output_tokens": 4,
            "reason": "recomputed",
            "raw_reason": "recomputed",
            "estimated": True,
        },
    )
    mirror = pipeline.fleets["default"].mirror
    request = mirror.requests["a"]
    assert "a" in mirror.pool and not request.finished and request.worker is None
    assert len(mirror.workers["w0"].active) == 0
    send(pipeline, {"type": "dispatch", "ts": 3.1, "request_id": "a", "worker": "w1"})
    assert request.worker is mirror.workers["w1"] and "a" not in mirror.pool
    assert request.generated() == 4  # its progress so far is kept
    send(pipeline, engine_finish("a", 9, ts=4.0))
    assert (request.finished, request.output_tokens) == (True, 9)
    assert violations(pipeline) == []
    reasons = pipeline.fleets["default"].core.join.reasons
    assert (reasons["recomputed"], reasons["length"]) == (1, 1)
    # a recomputed request's finish row is no finish of it: counted by no estimate
    assert join_counts(pipeline) == (0, 0, 0)


def test_recompute_before_the_first_step_and_back_to_the_same_worker():
    """The request waited in the worker's `starting` list: back on the same worker it
    must be there once (twice, a step it missed would hold it back two tokens)."""
    core = FleetCore("f")
    mirror = core.mirror
    core.worker(0.0, "w0", 4, "up")
    core.ready(1.0, "a", 10, None)
    core.dispatch(1.0, "a", "w0")
    _, outcome = core.finish_event(1.1, "a", 0, "recomputed")
    assert outcome.kind == "recomputed"
    core.dispatch(1.2, "a", "w0")
    assert mirror.workers["w0"].starting == [mirror.requests["a"]]
    # a step that started before the new dispatch: the request did not run in it
    view = mirror.apply_engine_step(1.3, "w0", 0, step_start=1.15)
    assert view is not None and view.running == 0
    assert mirror.requests["a"].generated() == 0 and mirror.workers["w0"].load == 10
    found, view = core.engine_step(1.5, "w0", 1, 1, 10.0)
    assert found == [] and view.running == 1 and mirror.requests["a"].generated() == 1


def test_unknown_reasons_are_kept_and_counted_as_other():
    core = FleetCore("f")
    core.worker(0.0, "w0", 4, "up")
    for rid, reason in (("a", "tool_calls"), ("b", "content_filter"), ("c", "repetition")):
        core.ready(1.0, rid, 10, None)
        core.dispatch(1.0, rid, "w0")
        found, outcome = core.finish_event(2.0, rid, 3, reason)
        assert found == [] and outcome.completed.reason == reason
    assert dict(core.join.reasons) == {"tool_calls": 1, "other": 1, "repetition": 1}
    assert reason_label("stop") == "stop" and reason_label("x") == "other"


def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_the_counters_on_metrics_after_posting_events(tmp_path):
    settings = load_settings(None, db=tmp_path / "m.duckdb", workers_processes=False)
    events = [
        *started("a", "b", "c"),
        tap_finish("a", 12),
        engine_finish("a", 17, ts=5.01),
        tap_finish("b", 3),
        {**tap_finish("c", 3), "reason": "content_filter", "raw_reason": "content_filter"},
        engine_finish("stranger", 40),
    ]
    app = create_app(settings)
    with served(app) as client:
        body = "\n".join(json.dumps(e) for e in events)
        response = client.post("/v1/events", content=body)
        assert response.status_code == 200 and response.json()["accepted"] == len(events)
        client.post("/v1/flush")
        found = metric_samples(client.get("/metrics").text)
        stored = app.state.shadow.runtime.store.query(
            "SELECT reason, raw_reason, estimated, from_engine FROM events "
            "WHERE type = 'finish' AND request_id = 'c'"
        )
    fleet = (("fleet", "default"),)
    assert found[("shadow_token_estimates_total", fleet)] == 3
    assert found[("shadow_token_corrections_total", fleet)] == 1
    assert found[("shadow_engine_finishes_unjoined_total", fleet)] == 1
    reasons = {
        labels[1][1]: value
        for (name, labels), value in found.items()
        if name == "shadow_finish_reasons_total"
    }
    assert reasons == {"length": 2, "other": 1}
    assert stored == [
        {"reason": "content_filter", "raw_reason": "content_filter", "estimated": True,
         "from_engine": None}
    ]  # fmt: skip


def test_a_straggler_joined_live_is_joined_again_in_stored_order_at_restart(tmp_path):
    """The engine's finish comes after the reorder window passed it: live, the tap's
    estimate finished the request and the straggler corrected it; at restart the stored
    events apply in time order, so the engine's finishes it. Either way one finish row
    per request is not joined to another, and the count is the exact one."""
    path = tmp_path / "straggler.duckdb"
    pipeline = open_pipeline(path)
    send(
        pipeline,
        *started("a"),
        tap_finish("a", 12, ts=5.0),
        {"type": "ready", "ts": 8.0, "request_id": "later", "prompt_tokens": 5},
        drain=False,
    )
    send(pipeline, engine_finish("a", 17, ts=4.9), drain=False)
    assert pipeline.fleets["default"].late_events == 1
    live = finish_rows(pipeline)
    assert live == {"engine": [("a", 17, "tap")], "tap": [("a", 17, None)]}
    pipeline.close()
    pipeline.store.close()
    again = open_pipeline(path)
    try:
        assert finish_rows(again) == {"engine": [("a", 17, None)], "tap": [("a", 17, "engine")]}
        assert again.fleets["default"].mirror.requests["a"].output_tokens == 17
        assert violations(again) == []
    finally:
        again.close()
        again.store.close()


@pytest.mark.parametrize("engine_first", [True, False])
def test_an_n_child_history_shows_its_kept_finish(tmp_path, engine_first):
    """The engine names the parent `<id>`, the tap the children `<id>#<k>`: a child's
    history (its `#` quoted: unquoted it starts the URL's fragment and the path names the
    parent) has one kept finish, the engine's exact count, whichever came first."""
    settings = load_settings(None, db=tmp_path / "n.duckdb", workers_processes=False)
    kids = ["cmpl-y-0#0", "cmpl-y-0#1"]
    engine = [engine_finish("cmpl-y-0", 7, ts=5.0), engine_finish("cmpl-y-0", 7, ts=5.0)]
    tap = [tap_finish(k, 5, ts=5.1 if engine_first else 4.9) for k in kids]
    events = [*started(*kids), *(engine + tap if engine_first else tap + engine)]
    with served(create_app(settings)) as client:
        response = client.post("/v1/events", content="\n".join(json.dumps(e) for e in events))
        assert response.json()["accepted"] == len(events)
        client.post("/v1/flush")
        for kid in kids:
            history = client.get(f"/v1/fleets/default/requests/{quote(kid, safe='')}").json()
            assert history["request_id"] == kid
            rows = [e for e in history["events"] if e["type"] == "finish"]
            kept = [(r["source"], r["output_tokens"]) for r in rows if r["joined_to"] is None]
            assert kept == [("engine" if engine_first else "tap", 7)], rows
            assert len(rows) == 2, rows  # the tap's and the engine's, one of them joined
        parent = client.get("/v1/fleets/default/requests/cmpl-y-0").json()["events"]
        assert [e["source"] for e in parent if e["type"] == "finish"] == ["engine", "engine"]


@pytest.mark.parametrize("tap_exact", [False, True])
def test_an_engine_finish_before_the_taps_events_is_held_and_joined(pipeline, tap_exact):
    """The plugin's batch overtook the tap's by more than the reorder window (seen with
    real vLLM: a non-streaming request's engine finish stored before its ready): the
    engine's count is held, and the tap's finish joins it instead of a second kept one."""
    send(pipeline, engine_finish("a", 17, ts=5.0))
    assert join_counts(pipeline) == (0, 0, 1)  # unjoined while the request is unseen
    send(pipeline, *started("a"))
    send(pipeline, tap_finish("a", 17 if tap_exact else 12, ts=5.1, estimated=not tap_exact))
    assert finish_rows(pipeline) == {"engine": [("a", 17, "tap")], "tap": [("a", 17, None)]}
    request = pipeline.fleets["default"].mirror.requests["a"]
    assert (request.finished, request.output_tokens, request.estimated) == (True, 17, False)
    assert join_counts(pipeline) == ((0, 0, 0) if tap_exact else (1, 1, 0))
    assert violations(pipeline) == []


def test_held_engine_finishes_are_bounded():
    from shadow.stream.join import EARLY_MAX, FinishJoin

    join = FinishJoin()
    for i in range(EARLY_MAX + 10):
        join.hold_early(f"r{i}", 5, i)
    assert len(join.early) == EARLY_MAX
    assert join.take_early("r0") is None  # the oldest went first
    assert join.take_early(f"r{EARLY_MAX + 9}") == (5, EARLY_MAX + 9)
    join.hold_early("p", 3, 1)
    join.hold_early("p", 4, 2)  # an n = 2 request: two engine finishes under the parent
    assert join.take_early("p#0") == (3, 1) and join.take_early("p#1") == (4, 2)
    assert join.take_early("p#1") is None
