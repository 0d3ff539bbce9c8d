"""Live routing with automatic fallback to Round-Robin, and the audit log behind it."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from shadow.replay.workload import StepModel, Workload
from shadow.service.http.app import create_app
from shadow.service.settings import load_settings
from shadow.stream.windows import WindowResult
from shadow.world.loadgen import run_load
from tests.service_helpers import served
from tests.test_e2e import start_world, wait_until

WORKERS = ["0", "1", "2", "3"]


def events(*items: dict) -> str:
    return "\n".join(json.dumps(i) for i in items)


@pytest.fixture
def service(tmp_path):
    settings = load_settings(
        None, db=tmp_path / "live.duckdb", workers_processes=False, windows=False,
        mode_cooldown_base_s=0.0, mode_recovery_windows=6, mode_min_requests=1,
    )  # fmt: skip
    app = create_app(settings)
    with served(app) as client:
        body = events(*[{"type": "worker", "ts": 1.0, "worker": w, "capacity": 4} for w in WORKERS])
        assert client.post("/v1/events", content=body).status_code == 200
        client.post("/v1/flush")
        yield client, app


def promote(client, reason: str = "gate passed") -> dict:
    response = client.post(
        "/v1/fleets/default/mode",
        json={"action": "set", "mode": "live", "policy": "brh-survival", "reason": reason},
    )
    assert response.status_code == 200, response.text
    return response.json()


def route(client, rid: str = "r1") -> dict:
    response = client.post(
        "/v1/route", json={"requests": [{"request_id": rid, "prompt_tokens": 500}]}
    )
    assert response.status_code == 200, response.text
    return response.json()


def router_of(app):
    return app.state.router


def test_shadow_mode_says_the_incumbent_decides_and_live_uses_the_policy(service):
    client, _ = service
    answer = route(client)
    assert answer["mode"] == "shadow" and answer["decisions"] == []
    assert "incumbent" in answer["detail"]
    promote(client)
    answer = route(client)
    assert answer["mode"] == "live" and answer["policy"] == "brh-survival"
    assert [d["request_id"] for d in answer["decisions"]] == ["r1"]
    assert answer["latency_ms"] < 50


def test_a_policy_exception_answers_with_round_robin_and_trips(service):
    client, app = service
    promote(client)

    def broken(fleet: str) -> None:
        raise RuntimeError("injected fault")

    router_of(app).before_decide = broken
    answer = route(client, "r2")
    assert answer["policy"] == "rr" and answer["mode"] == "fallback"
    assert answer["decisions"][0]["worker"] in WORKERS  # the request was still routed
    assert client.get("/v1/fleets/default/mode").json()["mode"] == "fallback"
    again = route(client, "r3")  # fallback: Round-Robin answers, no policy runs
    assert (
        again["policy"] == "rr"
        and again["decisions"][0]["worker"] != answer["decisions"][0]["worker"]
    )


def test_recovery_only_after_r_healthy_windows_and_the_fourth_trip_latches(service):
    client, app = service
    router = router_of(app)
    pipeline = router.pipeline
    state = pipeline.fleets["default"]

    def window(index: int, healthy: bool) -> WindowResult:
        incumbent = {"imbalance_mean": 1000.0}
        candidate = {"imbalance_mean": 800.0 if healthy else 2000.0}
        metrics = {"jsq-pool": incumbent, "brh-survival": candidate}
        start = index * 30.0
        return WindowResult("default", index, start, start + 30, 50, 0, StepModel(), metrics,
                            1.0, 1.0)  # fmt: skip

    promote(client)
    router.before_decide = lambda fleet: (_ for _ in ()).throw(RuntimeError("fault"))
    route(client)
    router.before_decide = None
    assert client.get("/v1/fleets/default/mode").json()["mode"] == "fallback"
    for index in range(5):  # 5 healthy windows: not enough (R = 6)
        pipeline.on_window(state, window(index, True))
    assert client.get("/v1/fleets/default/mode").json()["mode"] == "fallback"
    pipeline.on_window(state, window(5, False))  # an unhealthy one restarts the count
    for index in range(6, 11):
        pipeline.on_window(state, window(index, True))
    assert client.get("/v1/fleets/default/mode").json()["mode"] == "fallback"
    pipeline.on_window(state, window(11, True))  # the sixth healthy in a row
    assert client.get("/v1/fleets/default/mode").json()["mode"] == "live"

    # Trips 2, 3 and 4 within 24 h: the fourth latches.
    for trip in (2, 3, 4):
        if client.get("/v1/fleets/default/mode").json()["mode"] != "live":
            promote(client, f"operator retries ({trip})")
        router.before_decide = lambda fleet: (_ for _ in ()).throw(RuntimeError("fault"))
        route(client, f"t{trip}")
        router.before_decide = None
    mode = client.get("/v1/fleets/default/mode").json()
    assert mode["mode"] == "latched" and len(mode["trips"]) == 4
    refused = client.post(
        "/v1/fleets/default/mode",
        json={"action": "set", "mode": "live", "policy": "brh-survival", "reason": "try"},
    )
    assert refused.status_code == 409  # only an operator reset leaves latched

    # Every transition is in the audit log, and the chain verifies until a row is altered.
    verify = client.get("/v1/audit/verify").json()
    assert verify["ok"] and verify["rows"] == 9
    with pipeline.store.engine.begin() as conn:
        kinds = [r[0] for r in conn.execute(text("SELECT kind FROM audit_log ORDER BY seq"))]
        # promote, trip, recover, trip, promote, trip, promote, latch, refused promote
        assert kinds == ["operator_action", "mode_transition", "mode_transition",
                         "mode_transition", "operator_action", "mode_transition",
                         "operator_action", "mode_transition", "operator_action"]  # fmt: skip
        conn.execute(text("UPDATE audit_log SET reason = 'nothing happened' WHERE seq = 3"))
    broken = client.get("/v1/audit/verify").json()
    assert not broken["ok"] and broken["first_bad_seq"] == 3


def test_stale_telemetry_on_the_emulated_fleet_trips_within_one_request(tmp_path):
    world, server, addresses = start_world(tmp_path, staleness_s=2.0)
    try:
        workload = Workload.from_arrays(
            "warm", np.arange(8) * 0.05, np.full(8, 300), np.full(8, 40)
        )
        asyncio.run(run_load(addresses.router, workload))
        with httpx.Client(base_url=server.url, timeout=30) as client:
            client.post("/v1/flush")
            # every engine's telemetry fresh first: on a loaded host it lagged past the
            # 2 s limit before the kill once, and the "before" route already fell back
            telemetry = "/v1/fleets/default/telemetry"
            wait_until(lambda: not any(
                e["stale"] for e in client.get(telemetry).json()["engines"].values()
            ))  # fmt: skip
            promote(client)
            answer = route(client, "before")
            assert answer["mode"] == "live" and answer["policy"] == "brh-survival"
            world.ask(("kill_worker", 2))
            wait_until(
                lambda: client.get("/v1/fleets/default/telemetry").json()["engines"]["2"]["stale"]
            )
            answer = route(client, "after")  # the first request after staleness
            assert answer["policy"] == "rr" and answer["mode"] == "fallback"
            assert "stale" in answer["detail"]
            assert client.get("/v1/audit/verify").json()["ok"]
    finally:
        world.stop()
        server.stop()
    time.sleep(0.1)
