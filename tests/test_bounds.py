"""Every bound answers with a clear error (or, for the reorder buffer, applies early), is
counted in /metrics, and never loses what was accepted before it."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.service_helpers import Server, write_config

LIMITS = {
    "max_body_bytes": 4096,
    "max_batch_events": 20,
    "max_fleets": 2,
    "max_workers_per_fleet": 2,
    "max_active_per_fleet": 3,
    "max_reorder_events": 1000,
    "reorder_window_s": 10_000.0,
    "windows": False,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounds")
    server = Server(root / "shadow.duckdb", write_config(root / "s.toml", **LIMITS)).start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http
    server.stop()


def post(client: httpx.Client, events: list[dict]) -> httpx.Response:
    body = "\n".join(json.dumps(e) for e in events)
    return client.post("/v1/events", content=body,
                       headers={"content-type": "application/x-ndjson"})  # fmt: skip


def hits(client: httpx.Client) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("shadow_bound_hits_total{"):
            name = line.split('bound="')[1].split('"')[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def test_body_and_batch_bounds_answer_413(client):
    before = hits(client)
    big = client.post("/v1/events", content=b"x" * 5000)
    assert big.status_code == 413 and "max_body_bytes" in big.text
    events = [{"type": "worker", "ts": 1.0, "worker": f"b{i}", "capacity": 4, "fleet": "b"}
              for i in range(21)]  # fmt: skip
    many = post(client, events)
    assert many.status_code == 413 and "max_batch_events (20)" in many.text
    after = hits(client)
    assert after["body_bytes"] == before["body_bytes"] + 1
    assert after["batch_events"] == before["batch_events"] + 1
    assert client.get("/v1/fleets").json() == []  # the refused batch stored nothing


def test_fleet_worker_and_active_bounds_reject_only_the_excess(client):
    events = [{"type": "worker", "ts": 1.0, "worker": f"w{i}", "capacity": 8} for i in range(3)]
    events += [{"type": "ready", "ts": 2.0 + i, "request_id": f"r{i}", "prompt_tokens": 5}
               for i in range(3)]  # fmt: skip
    events += [{"type": "worker", "ts": 1.0, "worker": "x", "capacity": 8, "fleet": f"f{i}"}
               for i in range(2)]  # fmt: skip
    result = post(client, events).json()
    assert result["accepted"] == len(events) - 2
    fields = sorted((e["field"], e["position"]) for e in result["errors"])
    assert fields == [("fleet", 7), ("worker", 2)]
    assert any("max_fleets (2)" in e["message"] for e in result["errors"])
    client.post("/v1/flush")  # apply: three requests now wait in the pool
    more = post(client, [{"type": "ready", "ts": 9.0, "request_id": "r9", "prompt_tokens": 5}])
    assert more.status_code == 400
    assert "max_active_per_fleet (3)" in more.json()["errors"][0]["message"]
    snapshot = client.get("/v1/fleets/default/snapshot").json()
    assert [w["worker"] for w in snapshot["workers"]] == ["w0", "w1"] and snapshot["pool"] == 3
    counted = hits(client)
    assert counted["fleets"] >= 1 and counted["workers_per_fleet"] >= 1
    assert counted["active_per_fleet"] >= 1


def test_reorder_buffer_overflow_applies_early_and_loses_nothing(client):
    before = hits(client)["reorder_buffer"]
    for chunk in range(0, 1020, 20):
        events = [{"type": "engine_step", "ts": 100.0 + i * 0.01, "worker": "w0", "step": i,
                   "duration_ms": 10.0, "running": 0, "fleet": "default"}
                  for i in range(chunk, chunk + 20)]  # fmt: skip
        assert post(client, events).status_code == 200
    assert hits(client)["reorder_buffer"] == before + 1
    snapshot = client.get("/v1/fleets/default/snapshot").json()
    assert snapshot["engine_steps"] >= 1000  # applied despite the 10,000 s reorder window


def test_page_size_bound_is_counted(client):
    before = hits(client)["page_size"]
    response = client.get("/v1/fleets/default/decisions", params={"limit": 5000})
    assert response.status_code == 422 and "limit" in response.text
    assert hits(client)["page_size"] == before + 1


def test_counts_past_32_bits_are_refused_without_breaking_ingest(client):
    """`running`, `waiting` and `capacity` are stored as 32-bit: a larger value used to
    abort the batch's transaction and stop ingest for good (503 until a restart)."""
    step = {"type": "engine_step", "ts": 500.0, "worker": "w0", "step": 90_000,
            "duration_ms": 10.0, "fleet": "default"}  # fmt: skip
    too_many = [
        {**step, "running": 2**31},
        {**step, "step": 90_001, "running": 1, "waiting": 2**40},
        {"type": "worker", "ts": 500.0, "worker": "w1", "capacity": 2**31},
    ]
    refused = post(client, too_many)
    assert refused.status_code == 400
    fields = sorted(e["field"] for e in refused.json()["errors"])
    assert fields == ["capacity", "running", "waiting"]
    largest = post(client, [{**step, "step": 90_002, "running": 2**31 - 1, "waiting": 2**31 - 1}])
    assert largest.status_code == 200 and largest.json()["accepted"] == 1
    assert client.post("/v1/flush").status_code == 200
    assert client.get("/v1/fleets/default/snapshot").status_code == 200
