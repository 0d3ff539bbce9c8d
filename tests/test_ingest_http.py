"""HTTP ingest: partial acceptance of malformed batches, size limits, crash safety."""

from __future__ import annotations

import json
import random
import threading

import httpx
import pytest

from shadow.events import iter_file
from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
from shadow.service.store import ServiceStore
from tests.service_helpers import Server, batches, mirror_state, post, record, write_config


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("http")
    config = write_config(root / "c.toml", windows=False, max_body_bytes=200_000)
    server = Server(root / "http.duckdb", config).start()
    yield server
    server.stop()


def test_malformed_events_get_per_event_errors_and_valid_ones_are_stored(server):
    lines = [
        {"type": "worker", "ts": 0, "worker": "w0", "capacity": 4},
        {"type": "ready", "ts": 1, "request_id": "good-1", "prompt_tokens": 10},
        {"type": "ready", "ts": 1, "request_id": "bad-type", "prompt_tokens": "ten"},
        {"type": "ready", "ts": 1, "prompt_tokens": 10},
        {"type": "teleport", "ts": 1},
        {"type": "ready", "ts": 1, "request_id": "negative", "prompt_tokens": -3},
        "this is not json",
        {"type": "dispatch", "ts": 1.5, "request_id": "good-1", "worker": "w0"},
    ]
    body = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    with httpx.Client(timeout=30) as client:
        response = client.post(f"{server.url}/v1/events", content=body)
        assert response.status_code == 200
        result = response.json()
        assert (result["accepted"], result["rejected"]) == (3, 5)
        errors = {e["position"]: e for e in result["errors"]}
        assert errors[2]["field"] == "prompt_tokens"
        assert errors[3]["field"] == "request_id" and "missing" in errors[3]["message"]
        assert "unknown event type 'teleport'" in errors[4]["message"]
        assert errors[5]["field"] == "prompt_tokens" and "-3" in errors[5]["message"]
        assert "not valid JSON" in errors[6]["message"] and errors[6]["line"] == 7
        client.post(f"{server.url}/v1/flush")
        snapshot = client.get(f"{server.url}/v1/fleets/default/snapshot").json()
        assert snapshot["workers"][0]["active"] == 1  # good-1 was stored and applied
        # A JSON array works the same way; all-invalid is a 400 with the reasons.
        array = client.post(
            f"{server.url}/v1/events",
            content=json.dumps([{"type": "ready", "ts": 2, "request_id": 5}]),
            headers={"content-type": "application/json"},
        )
        assert array.status_code == 400
        assert array.json()["errors"][0]["field"] == "prompt_tokens"


def test_an_oversized_body_is_refused_with_413(server):
    line = json.dumps({"type": "ready", "ts": 1, "request_id": "x", "prompt_tokens": 1})
    body = "\n".join([line] * 10_000)  # about 700 kB, over the 200 kB limit
    with httpx.Client(timeout=30) as client:
        response = client.post(f"{server.url}/v1/events", content=body)
        assert response.status_code == 413
        chunked = client.post(f"{server.url}/v1/events", content=iter([body.encode()]))
        assert chunked.status_code == 413


def test_sigkill_in_the_middle_of_ingest_loses_nothing_acknowledged(tmp_path):
    log = tmp_path / "events.jsonl"
    record(log, requests=800, seed=3)
    parts = batches(log, 1000)
    config = write_config(tmp_path / "c.toml", windows=False)
    server = Server(tmp_path / "crash.duckdb", config).start()
    acknowledged: list[int] = []
    stop = threading.Event()

    def client_loop() -> None:
        with httpx.Client(timeout=30) as client:
            for index, body in enumerate(parts):
                if stop.is_set():
                    return
                try:
                    post(client, server.url, body)
                except (httpx.HTTPError, AssertionError):
                    return
                acknowledged.append(index)

    thread = threading.Thread(target=client_loop)
    thread.start()
    kill_after = random.Random(7).randint(5, len(parts) - 5)
    while len(acknowledged) < kill_after and thread.is_alive():
        threading.Event().wait(0.005)
    server.kill()  # mid-stream: the request in flight is not acknowledged
    stop.set()
    thread.join()
    assert 0 < len(acknowledged) < len(parts)
    server.start()
    try:
        with httpx.Client(timeout=60) as client:
            for body in parts[len(acknowledged) :]:  # the client retries what was not acked
                post(client, server.url, body)
            client.post(f"{server.url}/v1/flush")
            recovered = mirror_state(client, server.url)
    finally:
        server.stop()

    reference = ServiceStore(tmp_path / "reference.duckdb")
    pipeline = Pipeline(reference, PipelineConfig(windows_enabled=False, audit_enabled=False))
    pipeline.start()
    for pairs, errors in iter_file(log):
        pipeline.submit(pairs, errors)
    pipeline.drain()
    mirror = pipeline.fleets["default"].mirror
    expected = {
        "workers": [(w.worker_id, len(w.active), w.load, w.steps) for w in mirror.order],
        "pool": len(mirror.pool),
    }
    reference.close()
    assert recovered == expected

    store = ServiceStore(tmp_path / "crash.duckdb")
    try:
        lifecycle = sum(1 for line in log.open() if '"type":"engine_step"' not in line
                        and '"type":"progress"' not in line)  # fmt: skip
        rows = store.query("SELECT count(*) AS n, count(DISTINCT seq) AS distinct_seq FROM events")
        assert rows[0]["n"] == rows[0]["distinct_seq"] == lifecycle
        steps = store.query(
            "SELECT count(*) AS n, count(DISTINCT (worker, step)) AS d FROM engine_steps"
        )[0]
        assert steps["n"] == steps["d"]
        audits = store.query(
            "SELECT count(*) AS n, count(DISTINCT (ingest_id, policy)) AS d FROM decisions"
        )[0]
        assert audits["n"] == audits["d"] == 800 * 3
    finally:
        store.close()
