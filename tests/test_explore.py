"""The UI's read API (docs/UI.md) on recorded traffic with known ground truth: the
comparison table, trajectories, decisions with filters and sorting, one decision's
snapshot, violation timelines, gate dry runs and stored replays."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import duckdb
import httpx
import numpy as np
import pytest

from shadow.analysis.comparison import rows_to_columns, summary_table
from shadow.gate.collect import collect_evidence
from shadow.gate.source import open_evidence
from shadow.gate.thresholds import Thresholds
from shadow.gate.verdict import decide
from shadow.storage import queries
from shadow.storage.database import duck_connection
from shadow.stream.stored_snapshot import unpack as unpack_snapshot
from shadow.stream.trajectory import Trajectory, bucket, join
from shadow.stream.windows import WINDOW_METRICS
from shadow.world.process import REPO
from tests.service_helpers import Server, record, write_config

FLEET = "/v1/fleets/default"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """1,500 recorded requests ingested with 20 s windows, one stored replay, a server."""
    root = tmp_path_factory.mktemp("explore")
    log, db = root / "events.jsonl", root / "shadow.duckdb"
    result, _ = record(log, 1500, load=1.0)
    config = write_config(root / "service.toml", window_s=20.0)
    cli = [sys.executable, "-m", "shadow.cli"]
    for command in (
        ["ingest", str(log), "--db", str(db), "--config", str(config)],
        ["replay", "synthetic:small", "--db", str(db), "--policies", "jsq,br0", "--workers", "4"],
    ):
        done = subprocess.run(cli + command, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    evidence = root / "evidence.duckdb"  # the gate's own read, beside the running server
    shutil.copyfile(db, evidence)
    server = Server(db, config).start()
    client = httpx.Client(base_url=server.url, timeout=30.0)
    try:
        yield client, result, evidence
    finally:
        client.close()
        server.stop()


def get(client: httpx.Client, path: str, **params) -> dict:
    response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_summary_ratios_are_the_quantities_a_replay_measures(service):
    client, _, _ = service
    summary = get(client, f"{FLEET}/summary")
    windows = get(client, f"{FLEET}/windows", limit=1000)["items"]
    assert summary["windows"] == len(windows) >= 5
    # a recording starts from an empty fleet: no warm-up to drop
    assert summary["evidence_windows"] == len(windows)
    rows = {r["policy"]: r for r in summary["rows"]}
    assert [r["policy"] for r in summary["rows"]][:2] == ["observed", "jsq-pool"]
    assert rows["jsq-pool"]["ratios"]["imbalance"] is None

    def weighted(policy: str, metric: str, weight: str) -> float:
        arms = [w["policies"][policy] for w in windows]
        return sum(a[metric] * a[weight] for a in arms if a[weight]) / sum(a[weight] for a in arms)

    # imbalance: the mean over steps; throughput: tokens over busy time
    for name, metric, weight in (
        ("imbalance", "imbalance_mean", "steps"),
        ("throughput", "throughput_tok_s", "busy_s"),
    ):
        ratio = rows["br0"]["ratios"][name]
        truth = weighted("br0", metric, weight) / weighted("jsq-pool", metric, weight)
        assert ratio["point"] == pytest.approx(truth, rel=1e-9)
        assert ratio["ci_low"] <= ratio["point"] <= ratio["ci_high"]
        assert ratio["n"] == len(windows)
    assert rows["br0"]["ratios"]["imbalance"]["point"] < 1.0  # BR-0 balances better than JSQ
    first = windows[0]["t_start"]
    later = get(client, f"{FLEET}/summary", since=first + 1e-6)
    assert later["windows"] == len(windows) - 1


def test_summary_ratios_are_the_gates_estimates(service):
    """The UI's table and the gate give one estimate: the same points, and with the
    gate's resamples the same intervals (on a copy of the service's database)."""
    client, _, evidence_db = service
    summary = {r["policy"]: r for r in get(client, f"{FLEET}/summary")["rows"]}
    store = open_evidence(evidence_db)
    try:
        thresholds = Thresholds()
        for candidate in ("br0", "brh-survival"):
            gate = get(client, f"{FLEET}/gate", candidate=candidate)
            rows = {r["metric"]: r for r in gate["rows"]}
            evidence = collect_evidence(
                store, fleet="default", candidate=candidate, baseline="jsq-pool"
            )
            decided = {r.metric: r for r in decide(evidence, thresholds).rows}
            _, columns = queries.summary_inputs(
                _Reader(store), "default", WINDOW_METRICS, None, None
            )
            full = {
                r["policy"]: r
                for r in summary_table(
                    columns, "jsq-pool", resamples=thresholds.bootstrap_resamples
                )["rows"]
            }
            for name, metric in (("throughput", "throughput_ratio"),
                                 ("tpot_p95", "tpot_p95_ratio"),
                                 ("imbalance", "imbalance_ratio")):  # fmt: skip
                page = summary[candidate]["ratios"][name]
                assert page["point"] == pytest.approx(rows[metric]["ratio"], rel=1e-12)
                exact = full[candidate]["ratios"][name]
                assert exact["point"] == decided[metric].ratio
                assert (exact["ci_low"], exact["ci_high"]) == (
                    decided[metric].ci_low,
                    decided[metric].ci_high,
                )
                assert page["ci_low"] <= page["point"] <= page["ci_high"]
    finally:
        store.close()


class _Reader:
    """`queries.Reader` over the gate's evidence source: rows, and numpy columns."""

    def __init__(self, store) -> None:
        self.store = store

    def query(self, sql: str, params: dict | None = None) -> list[dict]:
        return self.store.query(sql, params)

    def columns(self, sql: str, params: dict | None = None) -> dict[str, np.ndarray]:
        with self.store.engine.connect() as conn:
            return duck_connection(conn).execute(sql, params or {}).fetchnumpy()


def test_compare_one_window_has_a_series_per_worker_per_policy(service):
    client, result, _ = service
    windows = get(client, f"{FLEET}/windows", limit=1000)["items"]
    chosen = windows[2]
    view = get(client, f"{FLEET}/compare", window=chosen["window_index"])
    assert view["windows"] == [chosen["window_index"]]
    assert list(view["series"]) == ["observed", "jsq-pool", "br0", "brh-survival"]
    assert view["workers"] == [str(g) for g in range(8)]
    for series in view["series"].values():
        assert len(series["loads"]) == 8
        assert all(len(loads) == len(series["t"]) for loads in series["loads"])
        assert chosen["t_start"] <= series["t"][0] and series["t"][-1] < chosen["t_end"]
    # the observed path is the recorded run's: its peak is the recording's peak in the window
    observed = np.array(view["series"]["observed"]["loads"])
    assert observed.max() <= result.worker_load.max()
    assert view["summary"]["windows"] == 1


def test_compare_over_a_range_joins_windows_and_limits_points(service):
    client, _, _ = service
    windows = get(client, f"{FLEET}/windows", limit=1000)["items"]
    since, until = windows[1]["t_start"], windows[4]["t_start"]
    view = get(client, f"{FLEET}/compare", since=since, until=until, points=50,
               policies="observed,br0")  # fmt: skip
    assert view["windows"] == [w["window_index"] for w in windows[1:4]]
    assert list(view["series"]) == ["observed", "br0"]
    t = view["series"]["br0"]["t"]
    assert len(t) == 50 and t == sorted(t)
    assert view["boundaries"] == [w["t_start"] for w in windows[1:4]]
    bad = client.get(f"{FLEET}/compare", params={"policies": "observed,nope"})
    assert bad.status_code == 422 and "nope" in bad.text


def test_decision_filters_and_sorting(service):
    client, _, _ = service
    everything = get(client, f"{FLEET}/decisions", snapshot="false", limit=1)["total"]
    by_worker = get(client, f"{FLEET}/decisions", worker="3", policy="br0", limit=200)
    assert 0 < by_worker["total"] < everything
    assert all("3" in (r["incumbent_worker"], r["choice"]) for r in by_worker["items"])
    regretful = get(client, f"{FLEET}/decisions", min_regret=100, sort="regret", limit=200)
    assert 0 < regretful["total"] < everything
    regrets = [r["regret"] for r in regretful["items"]]
    assert min(regrets) >= 100 and regrets == sorted(regrets, reverse=True)
    by_id = get(client, f"{FLEET}/decisions", sort="request_id", order="asc", limit=50)
    ids = [r["request_id"] for r in by_id["items"]]
    assert ids == sorted(ids)
    bad = client.get(f"{FLEET}/decisions", params={"sort": "snapshot; DROP TABLE decisions"})
    assert bad.status_code == 422


def test_one_decision_shows_its_snapshot_and_every_choice(service):
    client, _, _ = service
    row = get(client, f"{FLEET}/decisions", disagreements_only="true", policy="br0",
              sort="regret", limit=1)["items"][0]  # fmt: skip
    detail = get(client, f"{FLEET}/decisions/{row['ingest_id']}")
    snapshot = detail["snapshot"]
    assert len(snapshot["loads"]) == len(snapshot["f_br0"]) == len(snapshot["f_brh"]) == 8
    g = snapshot["workers"].index(detail["incumbent_worker"])
    assert snapshot["f_br0"][g] == pytest.approx(detail["f_br0_incumbent"])
    assert snapshot["f_brh"][g] == pytest.approx(detail["f_brh_incumbent"], abs=1e-3)
    assert max(snapshot["f_br0"]) == pytest.approx(detail["f_br0_best"])
    assert snapshot["margins"] == [max(snapshot["loads"]) - v for v in snapshot["loads"]]
    choices = {c["policy"]: c for c in detail["choices"]}
    assert set(choices) == {"jsq-pool", "br0", "brh-survival"}
    assert choices["br0"]["choice"] == row["choice"] and not choices["br0"]["agrees"]
    assert client.get(f"{FLEET}/decisions/999999999").status_code == 404


def test_violation_timeline_counts_each_kind(service):
    client, _, _ = service
    now = get(client, "/v1/fleets")[0]["last_event_ts"]
    events = [
        {
            "type": "finish",
            "ts": now + 1,
            "request_id": f"ghost-{i}",
            "output_tokens": 1,
            "reason": "stop",
        }
        for i in range(3)
    ]
    body = "\n".join(json.dumps(e) for e in events)
    posted = client.post("/v1/events", content=body,
                         headers={"content-type": "application/x-ndjson"})  # fmt: skip
    assert posted.status_code == 200, posted.text
    client.post("/v1/flush")
    timeline = get(client, f"{FLEET}/violations/timeline", buckets=10)
    assert timeline["kinds"] == ["finish_unknown_request"]
    assert sum(timeline["counts"]["finish_unknown_request"]) == 3
    assert len(timeline["t"]) == 10


def test_gate_dry_run_is_recorded_and_listed(service):
    client, _, _ = service
    before = get(client, f"{FLEET}/mode")
    body = {"candidate": "br0", "baseline": "jsq-pool"}
    response = client.post(f"{FLEET}/gate/dry-run", json=body)
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["dry_run"] is True and report["verdict"] in (
        "PASS", "FAIL", "MARGINAL", "INCONCLUSIVE")  # fmt: skip
    runs = get(client, f"{FLEET}/gate/runs")["items"]
    assert runs[0]["id"] == report["id"] and runs[0]["dry_run"] is True
    stored = get(client, f"/v1/gate/runs/{report['id']}")
    assert stored["verdict"] == report["verdict"] and stored["rows"] == report["rows"]
    assert get(client, f"{FLEET}/mode") == before
    assert get(client, "/v1/fleets")[0]["gate"]["id"] == report["id"]
    log = get(client, "/v1/audit/log", fleet="default", kind="gate_run")["items"]
    assert log and log[0]["payload"]["verdict"] == report["verdict"]
    bad = client.post(f"{FLEET}/gate/dry-run", json={"candidate": "nope"})
    assert bad.status_code == 422 and "candidate" in bad.text


def test_stored_replays_list_and_series(service):
    client, _, _ = service
    runs = get(client, "/v1/replays")["items"]
    assert len(runs) == 1 and {p["policy"] for p in runs[0]["policies"]} == {"jsq", "br0"}
    run = get(client, f"/v1/replays/{runs[0]['id']}", points=40)
    assert set(run["series"]) == {"jsq", "br0"}
    for series in run["series"].values():
        assert 0 < len(series["t_ms"]) <= 40 and series["t_ms"] == sorted(series["t_ms"])
        assert min(series["imbalance"]) >= 0
    assert client.get("/v1/replays/424242").status_code == 404


def test_ui_pages_are_served_with_security_headers(service):
    client, _, _ = service
    for path in ("/", "/compare", "/decisions", "/integrity", "/gate", "/replays"):
        response = client.get(path)
        assert response.status_code == 200 and "text/html" in response.headers["content-type"]
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
    api = client.get("/v1/fleets")  # the API's answers carry them too
    assert api.headers["x-frame-options"] == "DENY" and "content-security-policy" in api.headers
    docs = client.get("/docs")  # FastAPI's Swagger page loads its own scripts: no CSP there
    assert docs.status_code == 200 and "content-security-policy" not in docs.headers
    assert docs.headers["x-content-type-options"] == "nosniff"


# -- pure pieces ---------------------------------------------------------------------


def test_bucket_means_every_quantity_per_time_bucket():
    start = np.array([0.0, 10.0, 20.0, 30.0])
    loads = np.array([[1, 3], [3, 5], [10, 0], [20, 0]])
    path = bucket(start, np.array([5.0, 7.0, 9.0, 11.0]), loads, span_ms=40.0, points=2)
    assert path.t_ms.tolist() == [5.0, 25.0]
    assert path.loads.tolist() == [[2.0, 4.0], [15.0, 0.0]]
    assert path.imbalance.tolist() == [2.0, 15.0]  # per-step max - min, then averaged
    assert path.gap.tolist() == [2.0, 15.0]
    assert path.step_ms.tolist() == [6.0, 10.0]
    again = Trajectory.decode({"points": 2, "workers": 2, **{
        k: v for k, v in path.encode().items() if k not in ("points", "workers")}})  # fmt: skip
    assert np.array_equal(again.loads, path.loads)


def test_join_orders_windows_and_rebuckets():
    one = bucket(np.arange(10.0), np.ones(10), np.ones((10, 2)), span_ms=10.0, points=10)
    two = bucket(np.arange(10.0), np.ones(10), np.full((10, 2), 3.0), span_ms=10.0, points=10)
    joined = join([(100.0, two), (50.0, one)], points=4)
    assert joined.points == 4
    assert joined.loads[0, 0] == 1.0 and joined.loads[-1, 0] == 3.0
    assert np.all(np.diff(joined.t_ms) > 0)


def test_summary_table_is_deterministic_and_pairs_windows():
    rows = []
    for w in range(40):
        rows.append({"window_index": w, "policy": "jsq", "imbalance_mean": 100.0 + w,
                     "throughput_tok_s": 10.0, "tpot_p95_ms": 50.0, "steps": 5})  # fmt: skip
        rows.append({"window_index": w, "policy": "br0", "imbalance_mean": 50.0 + w / 2,
                     "throughput_tok_s": 11.0, "tpot_p95_ms": 45.0, "steps": 5})  # fmt: skip
    table = summary_table(rows_to_columns(rows), "jsq")
    assert table == summary_table(rows_to_columns(rows), "jsq")
    br0 = next(r for r in table["rows"] if r["policy"] == "br0")
    # perfectly paired halves: every resample gives exactly 0.5
    assert br0["ratios"]["imbalance"]["point"] == pytest.approx(0.5)
    assert br0["ratios"]["imbalance"]["ci_low"] == pytest.approx(0.5)
    assert br0["ratios"]["throughput"]["point"] == pytest.approx(1.1)
    assert br0["steps"] == 200


def test_each_dispatch_stores_its_snapshot_once_and_every_row_shows_it(service):
    """The audit writes a dispatch's snapshot on one of its rows (without what the loads
    give, as bytes since 0015); the list shows every row its dispatch's whole snapshot, as the
    detail does."""
    client, _, db = service
    with duckdb.connect(str(db), read_only=True) as con:
        per_dispatch = con.execute(
            "SELECT count(snapshot_z), count(snapshot), count(*) FROM decisions "
            "GROUP BY fleet, ingest_id"
        ).fetchall()
        stored = unpack_snapshot(
            con.execute(
                "SELECT snapshot_z FROM decisions WHERE snapshot_z IS NOT NULL LIMIT 1"
            ).fetchone()[0]
        )
    assert per_dispatch and all(
        (kept, as_text, rows) == (1, 0, 3) for kept, as_text, rows in per_dispatch
    )
    assert set(stored) == {"workers", "loads", "active", "capacity", "f_brh"}
    rows = get(client, f"{FLEET}/decisions", limit=300)["items"]
    assert len({r["ingest_id"] for r in rows}) < len(rows)  # dispatches with several rows
    details = {}
    for row in rows:
        if row["ingest_id"] not in details and len(details) < 40:
            details[row["ingest_id"]] = get(client, f"{FLEET}/decisions/{row['ingest_id']}")
        if row["ingest_id"] in details:
            assert row["snapshot"] == details[row["ingest_id"]]["snapshot"]
        snapshot = row["snapshot"]
        g = snapshot["workers"].index(row["incumbent_worker"])
        assert snapshot["f_br0"][g] == pytest.approx(row["f_br0_incumbent"])
        free = [c - a for c, a in zip(snapshot["capacity"], snapshot["active"], strict=True)]
        scored = [f for f, room in zip(snapshot["f_br0"], free, strict=True) if room > 0]
        assert max(scored or snapshot["f_br0"]) == pytest.approx(row["f_br0_best"])
