"""`/metrics`: every `shadow_` family, named by Prometheus rules, with values that match."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from shadow.service.http.app import create_app
from shadow.service.settings import load_settings
from tests.service_helpers import batches, record, served


def samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_after_recorded_traffic(tmp_path):
    log = tmp_path / "jsq.jsonl"
    result, _ = record(log, 400)
    settings = load_settings(None, db=tmp_path / "m.duckdb", workers_processes=False, window_s=10.0)
    with served(create_app(settings)) as client:
        for body in batches(log, 2000):
            assert client.post("/v1/events", content=body).status_code == 200
        client.post("/v1/flush")
        client.post(
            "/v1/fleets/default/mode",
            json={"action": "set", "mode": "live", "policy": "br0", "reason": "metrics test"},
        )
        client.post("/v1/route", json={"requests": [{"request_id": "x", "prompt_tokens": 10}]})
        response = client.get("/metrics")
        fleets = {f["fleet"]: f for f in client.get("/v1/fleets").json()}
    # what the UI shows of the audit's sampler: nothing skipped, every dispatch audited
    assert fleets["default"]["audit"] == {"audited": 400, "skipped": 0, "stride": 1}
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    names = {name for name, _ in found}
    for name in (
        "shadow_events_total", "shadow_events_rejected_total", "shadow_mirror_kv_tokens",
        "shadow_mirror_active_requests", "shadow_pool_requests",
        "shadow_observed_imbalance_tokens", "shadow_observed_gap_tokens",
        "shadow_window_imbalance_tokens", "shadow_window_throughput_tokens_per_second",
        "shadow_window_tpot_p95_seconds", "shadow_window_ratio", "shadow_replay_fidelity_ratio",
        "shadow_step_model_seconds_per_token", "shadow_step_model_fixed_seconds",
        "shadow_decision_agreement_ratio", "shadow_decision_regret_tokens", "shadow_mode",
        "shadow_fallback_trips", "shadow_route_decision_seconds_count",
        "shadow_mirror_state_mismatches_total", "shadow_predictor_calibration_auc",
        "shadow_audit_backlog_batches", "shadow_audit_lag_seconds",
        "shadow_audit_skipped_total", "shadow_audit_sample_stride", "shadow_held_requests",
    ):  # fmt: skip
        assert name in names, name
    assert found[("shadow_audit_lag_seconds", ())] == 0.0  # flushed: the audit caught up
    # sampling off (the default): every dispatch audited, none skipped
    assert found[("shadow_audit_skipped_total", (("fleet", "default"),))] == 0
    assert found[("shadow_audit_sample_stride", (("fleet", "default"),))] == 1
    assert all(name.startswith("shadow_") for name in names if not name.startswith("python_"))
    # Declared even when the latest window has no value for it (no arrivals: no pool wait).
    declared = {f.name for f in text_string_to_metric_families(response.text)}
    assert "shadow_window_pool_wait_p95_seconds" in declared
    dispatches = found[
        (
            "shadow_events_total",
            (("fleet", "default"), ("outcome", "accepted"), ("type", "dispatch")),
        )
    ]
    assert dispatches == 400
    # every request finished, and is remembered (finished_ttl_s) rather than live; the
    # window tracker holds at most them all (it lets go once their windows are evaluated)
    held = {dict(labels)["holder"]: value for (name, labels), value in found.items()
            if name == "shadow_held_requests"}  # fmt: skip
    assert held["live"] == 0 and held["finished"] == 400, held
    assert 0 <= held["windows"] <= 400, held
    assert found[("shadow_mode", (("fleet", "default"), ("mode", "live")))] == 1.0
    assert found[("shadow_mirror_state_mismatches_total", (("fleet", "default"),))] == 0
    jsq_agreement = found[("shadow_decision_agreement_ratio",
                           (("fleet", "default"), ("policy", "jsq-pool")))]  # fmt: skip
    assert jsq_agreement == 1.0
    assert found[("shadow_route_decision_seconds_count", (("policy", "br0"),))] == 1
    step_b = found[("shadow_step_model_fixed_seconds", (("fleet", "default"),))]
    assert abs(step_b - 0.020) < 1e-6  # the fitted 20 ms, in seconds
    auc = found[("shadow_predictor_calibration_auc", (("fleet", "default"),))]
    assert 0.5 < auc <= 1.0
    assert result.steps > 0


def test_footprint_of_the_server_its_workers_and_duckdb(tmp_path):
    """Resident memory per process (server, audit and window workers) and DuckDB's
    memory by tag: what an operator watches to see the footprint stay flat."""
    log = tmp_path / "jsq.jsonl"
    record(log, 200)
    settings = load_settings(None, db=tmp_path / "f.duckdb", workers_processes=True)
    with served(create_app(settings)) as client:
        for body in batches(log, 2000):
            assert client.post("/v1/events", content=body).status_code == 200
        found = samples(client.get("/metrics").text)
    resident = {
        dict(labels)["process"]: value
        for (name, labels), value in found.items()
        if name == "shadow_resident_memory_bytes"
    }
    # the service starts both worker processes before it answers
    assert set(resident) == {"server", "audit", "windows"}
    assert all(value > 10 * 2**20 for value in resident.values()), resident
    duck = {
        dict(labels)["tag"]: value
        for (name, labels), value in found.items()
        if name == "shadow_duckdb_memory_bytes"
    }
    assert duck.get("BASE_TABLE", 0) > 0, duck
