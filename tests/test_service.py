"""The service core on recorded traffic with known ground truth, over a file and over HTTP."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from shadow.cli import app
from shadow.service.store import ServiceStore
from tests.service_helpers import Server, batches, mirror_state, post, record, write_config

REQUESTS = 2500


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("recorded") / "events.jsonl"
    result, workload = record(path, REQUESTS)
    return path, result, workload


@pytest.fixture(scope="module")
def file_ingest(recorded, tmp_path_factory):
    """`shadow ingest` of the recorded log into a fresh database."""
    path, _, _ = recorded
    db = tmp_path_factory.mktemp("file") / "shadow.duckdb"
    outcome = CliRunner().invoke(app, ["ingest", str(path), "--db", str(db)])
    assert outcome.exit_code == 0, outcome.output
    store = ServiceStore(db)
    yield store, outcome.output
    store.close()


def test_file_ingest_stores_every_lifecycle_event_and_step(recorded, file_ingest):
    _, result, _ = recorded
    store, output = file_ingest
    assert "0 rejected" in output
    counts = {r["type"]: r["n"] for r in store.query(
        "SELECT type, count(*) AS n FROM events GROUP BY type")}  # fmt: skip
    assert counts == {"worker": 8, "ready": REQUESTS, "dispatch": REQUESTS, "finish": REQUESTS}
    stored = store.query("SELECT step, worker, kv_tokens, running FROM engine_steps")
    loads = np.zeros((result.steps, 8), dtype=np.int64)
    for row in stored:
        loads[row["step"], int(row["worker"])] = row["kv_tokens"]
    assert len(stored) == result.steps * 8
    assert np.array_equal(loads, result.worker_load)
    progress = store.query("SELECT count(*) AS n, min(generated) AS low FROM progress_latest")[0]
    assert progress["n"] == REQUESTS  # the latest cumulative progress per request only
    assert store.query("SELECT count(*) AS n FROM progress_log")[0]["n"] == 0  # folded at close


def test_file_ingest_has_no_violations_and_a_full_audit(file_ingest):
    store, _ = file_ingest
    assert store.query("SELECT count(*) AS n FROM violations")[0]["n"] == 0
    audit = {r["policy"]: r for r in store.query(
        "SELECT policy, count(*) AS n, avg(agrees::int) AS agree, avg(mirror_jsq_agrees::int) "
        "AS jsq FROM decisions GROUP BY policy")}  # fmt: skip
    assert set(audit) == {"jsq-pool", "br0", "brh-survival"}
    assert all(row["n"] == REQUESTS for row in audit.values())
    assert audit["jsq-pool"]["agree"] == 1.0 and audit["br0"]["jsq"] == 1.0  # mirror-JSQ = real JSQ
    assert audit["br0"]["agree"] < 1.0  # BR-0 really decides differently
    regret = store.query(
        "SELECT min(f_br0_best - f_br0_incumbent) AS low FROM decisions WHERE policy = 'br0'"
    )[0]["low"]
    assert regret >= 0  # the best choice is never worse than the incumbent's


def test_windowed_replay_matches_jsq_and_br_wins_most_windows(file_ingest):
    store, _ = file_ingest
    windows = store.query("SELECT * FROM windows ORDER BY window_index")
    assert len(windows) >= 6
    metrics = {}
    for row in store.query("SELECT * FROM window_metrics"):
        metrics.setdefault(row["window_index"], {})[row["policy"]] = row
    for window in windows:
        assert window["imputed"] == 0
        assert abs(window["fidelity_imbalance"] - 1) <= 0.01, window
        assert abs(window["fidelity_step"] - 1) <= 0.01, window
        observed = metrics[window["window_index"]]["observed"]
        replayed = metrics[window["window_index"]]["jsq-pool"]
        for metric in ("tpot_p95_ms", "throughput_tok_s", "gap_mean"):
            assert replayed[metric] == pytest.approx(observed[metric], rel=0.01), metric
    for policy in ("br0", "brh-survival"):
        better = sum(
            metrics[w["window_index"]][policy]["imbalance_mean"]
            < metrics[w["window_index"]]["jsq-pool"]["imbalance_mean"]
            for w in windows
        )
        assert better > len(windows) / 2, (policy, better, len(windows))
    fit = store.query("SELECT * FROM step_model_fits ORDER BY fitted_at DESC LIMIT 1")[0]
    assert not fit["fallback"]
    assert fit["a_ms_per_token"] == pytest.approx(1.2e-4, rel=1e-6)
    assert fit["b_ms"] == pytest.approx(20.0, rel=1e-6)


def test_http_ingest_matches_file_ingest(recorded, file_ingest, tmp_path):
    path, result, _ = recorded
    store, _ = file_ingest
    server = Server(tmp_path / "http.duckdb").start()
    try:
        with httpx.Client(timeout=60) as client:
            totals = {"accepted": 0, "duplicates": 0, "rejected": 0}
            for body in batches(path, 1000):
                reply = post(client, server.url, body)
                for key in totals:
                    totals[key] += reply[key]
            assert totals == {"accepted": sum(1 for _ in path.open()), "duplicates": 0,
                              "rejected": 0}  # fmt: skip
            # Sending everything again changes nothing: every event is a duplicate.
            again = post(client, server.url, batches(path, 10**9)[0])
            assert again["accepted"] == 0 and again["duplicates"] == totals["accepted"]
            client.post(f"{server.url}/v1/flush")
            snapshot = client.get(f"{server.url}/v1/fleets/default/snapshot").json()
            assert snapshot["state_mismatches"] == 0
            assert snapshot["engine_steps"] == result.steps * 8
            decisions = client.get(
                f"{server.url}/v1/fleets/default/decisions",
                params={"policy": "br0", "disagreements_only": True, "limit": 5},
            ).json()
            file_disagree = store.query(
                "SELECT count(*) AS n FROM decisions WHERE policy = 'br0' AND NOT agrees"
            )[0]["n"]
            assert decisions["total"] == file_disagree
            assert len(decisions["items"]) == 5
            assert all(not d["agrees"] for d in decisions["items"])
            assert len(decisions["items"][0]["snapshot"]["loads"]) == 8
            violations = client.get(f"{server.url}/v1/fleets/default/violations").json()
            assert violations["total"] == 0
            # the window worker evaluates in the background, and a flush stores only the
            # replays that finished: on a slow host the last ones come a little later
            deadline = time.monotonic() + 120
            windows = client.get(f"{server.url}/v1/fleets/default/windows").json()
            while windows["total"] < 5 and time.monotonic() < deadline:
                time.sleep(0.5)
                client.post(f"{server.url}/v1/flush")
                windows = client.get(f"{server.url}/v1/fleets/default/windows").json()
            assert windows["total"] >= 5
            first = windows["items"][0]
            stored = store.query(
                "SELECT imbalance_mean FROM window_metrics WHERE window_index = :i AND "
                "policy = 'br0'", {"i": first["window_index"]})  # fmt: skip
            assert first["policies"]["br0"]["imbalance_mean"] == stored[0]["imbalance_mean"]
            fit = client.get(f"{server.url}/v1/fleets/default/stepmodel").json()
            assert fit["fallback"] is False
            assert client.get(f"{server.url}/docs").status_code == 200
    finally:
        server.stop()


def test_restart_rebuilds_the_mirror_without_duplicates(recorded, tmp_path):
    path, _, _ = recorded
    parts = batches(path, 1000)
    half = len(parts) // 2
    config = write_config(tmp_path / "c.toml", windows=False)
    reference = Server(tmp_path / "ref.duckdb", config).start()
    server = Server(tmp_path / "restart.duckdb", config).start()
    try:
        with httpx.Client(timeout=60) as client:
            for body in parts:
                post(client, reference.url, body)
            client.post(f"{reference.url}/v1/flush")
            expected = mirror_state(client, reference.url)
            for body in parts[:half]:
                post(client, server.url, body)
            server.stop()
            server.start()
            for body in parts[half - 2 :]:  # resend two acknowledged batches too
                post(client, server.url, body)
            client.post(f"{server.url}/v1/flush")
            assert mirror_state(client, server.url) == expected
            ref_n = client.get(f"{reference.url}/v1/fleets/default/decisions").json()["total"]
            got_n = client.get(f"{server.url}/v1/fleets/default/decisions").json()["total"]
            assert got_n == ref_n
    finally:
        server.stop()
        reference.stop()


def test_windows_with_unfinished_requests_are_imputed_after_the_lag(recorded, tmp_path):
    """Drop the finish of a few requests: their windows wait, then replay with imputed
    lengths and say so."""
    from shadow.events import iter_file
    from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
    from shadow.stream.windows import WindowConfig

    path, _, _ = recorded
    silent = {f"req-{i}" for i in range(100, 110)}
    trimmed = tmp_path / "trimmed.jsonl"
    with path.open() as source, trimmed.open("w") as out:
        for line in source:
            if '"type":"finish"' in line and any(f'"{rid}"' in line for rid in silent):
                continue
            out.write(line)
    store = ServiceStore(tmp_path / "imputed.duckdb")
    # The lag outlasts a request's life (~64 s), so only the silenced ones get imputed.
    config = PipelineConfig(windows=WindowConfig(max_lag_s=200.0), audit_enabled=False)
    pipeline = Pipeline(store, config)
    pipeline.start()
    for pairs, errors in iter_file(trimmed):
        pipeline.submit(pairs, errors)
    pipeline.finish()
    rows = store.query("SELECT window_index, imputed FROM windows ORDER BY window_index")
    store.close()
    assert pipeline.fleets["default"].window_failures == 0
    assert len(rows) >= 8
    assert any(r["imputed"] > 0 for r in rows)
    assert all(r["imputed"] <= len(silent) for r in rows)
