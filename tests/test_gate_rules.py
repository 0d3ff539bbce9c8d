"""Every gate rule fails for its own reason on real evidence: recorded traffic posted to a
running `shadow serve` over HTTP, audited and replayed by its worker processes, judged by
`shadow gate` on the database it wrote.

The policies that break the rules (tests/gate_policies.py) are named in the service's
`policy_modules`, so its spawned workers register them too. The recorded fleet has a
ninth worker announced down, and one engine whose step counter starts elsewhere (engines
count their own steps): the windows must be replayed on the eight that run, and the
observed fleet must still be read step for step.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

import tests.gate_policies  # noqa: F401  (registers the rule-breaking policies here too)
from shadow.cli import app
from shadow.predict import SurvivalPredictor, calibrate, prequential_calibrate
from shadow.service.store import ServiceStore
from tests.service_helpers import Server, batches, post, record

runner = CliRunner()
REQUESTS = 2500
POLICIES = ["jsq-pool", "br0", "brh-survival", "slow-jsq", "raising-jsq", "brh-contrarian"]
DOWN_WORKER = "8"
OFFSET_WORKER, STEP_OFFSET = 3, 100_000


def _doctored_log(path, out):
    """The recorded log with worker 8 announced down and worker 3 counting its steps from
    100,000 (seqs renumbered so every event stays unique)."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    workers = sum(1 for e in events if e["type"] == "worker")
    down = dict(events[0], worker=DOWN_WORKER, state="down")
    events.insert(workers, down)
    for seq, event in enumerate(events, start=1):
        event["seq"] = seq
        if event["type"] == "engine_step" and str(event["worker"]) == str(OFFSET_WORKER):
            event["step"] += STEP_OFFSET
    out.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    return len(events)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules")
    recorded = root / "jsq.jsonl"
    record(recorded, REQUESTS, load=0.8)
    log = root / "doctored.jsonl"
    total = _doctored_log(recorded, log)
    config = root / "shadow.toml"
    config.write_text(
        'policy_modules = ["tests.gate_policies"]\n'
        f"[audit]\npolicies = {json.dumps(POLICIES)}\n"
        f"[windows]\npolicies = {json.dumps(POLICIES)}\n"
    )
    db = root / "shadow.duckdb"
    server = Server(db, config).start(timeout=120)
    accepted = []
    try:
        with httpx.Client(timeout=120) as client:
            for body in batches(log, 2000):
                reply = post(client, server.url, body)  # asserts 200: ingest goes on
                accepted.append(reply["accepted"])
            client.post(f"{server.url}/v1/flush")
            health = client.get(f"{server.url}/healthz")
    finally:
        server.stop()
    return root, db, total, accepted, health


def gate(root, db, candidate, *args):
    out = root / f"{candidate}.json"
    result = runner.invoke(
        app, ["gate", "--db", str(db), "--candidate", candidate, "--json", str(out), *args]
    )
    assert isinstance(result.exception, SystemExit | None), repr(result.exception)
    assert result.exit_code in (0, 1, 3, 4), result.output
    report = json.loads(out.read_text())
    return result.exit_code, report, {r["metric"]: r for r in report["rows"]}


def test_a_raising_policy_fails_the_errors_rule_and_ingest_goes_on(served):
    root, db, total, accepted, health = served
    assert sum(accepted) == total and health.status_code == 200
    assert all(n > 0 for n in accepted)  # every batch after the first error was taken too
    store = ServiceStore(db)
    try:
        # this policy's errors alone: another candidate's (slow-jsq timed out in a round on
        # a loaded host) is in the same table, and the gate counts them per policy
        errors = store.query(
            "SELECT count(*) AS n, min(detail) AS detail FROM violations "
            "WHERE kind = 'shadow_decision_error' AND detail LIKE 'raising-jsq failed %'"
        )[0]
        decided = store.query("SELECT count(*) AS n FROM decisions WHERE policy = 'raising-jsq'")[
            0
        ]["n"]
    finally:
        store.close()
    assert errors["n"] > 0 and "raising-jsq failed deciding" in errors["detail"]
    assert "PromptLengthBug" in errors["detail"]
    assert decided == REQUESTS  # every dispatch still audited
    code, report, rows = gate(root, db, "raising-jsq")
    assert code == 1 and report["verdict"] == "FAIL"
    assert report["deciding_rule"].startswith("FAIL: HARD rule candidate_errors")
    assert rows["candidate_errors"]["candidate"] == errors["n"]
    # the same evidence holds no error of JSQ itself: the rule fails for this policy alone
    _, _, jsq_rows = gate(root, db, "jsq-pool")
    assert jsq_rows["candidate_errors"]["candidate"] == 0


def test_a_slow_policy_fails_the_latency_rule(served):
    root, db, *_ = served
    code, report, rows = gate(root, db, "slow-jsq")
    assert code == 1
    assert report["deciding_rule"].startswith("FAIL: HARD rule decision_latency_p99_ms")
    assert rows["decision_latency_p99_ms"]["candidate"] > 5.0
    assert rows["candidate_errors"]["candidate"] == 0  # slow, not timed out
    # the round it replaces, timed the same way, is well inside the rule
    _, _, jsq_rows = gate(root, db, "jsq-pool")
    assert jsq_rows["decision_latency_p99_ms"]["label"] == "pass"


def test_a_miscalibrated_predictor_fails_calibration_prequentially(served):
    root, db, *_ = served
    _, report, rows = gate(root, db, "brh-contrarian")
    calibration = rows["predictor_calibration"]
    assert calibration["label"] == "out of bounds" and calibration["candidate"] < 0.7
    assert report["verdict"] != "PASS"
    _, _, honest = gate(root, db, "brh-survival")
    assert honest["predictor_calibration"]["label"] == "pass"
    # scored at the H asked for: another H is another question with another answer
    _, _, short = gate(root, db, "brh-survival", "--horizon", "8")
    assert (
        short["predictor_calibration"]["candidate"] != honest["predictor_calibration"]["candidate"]
    )


def test_a_down_worker_is_left_out_and_steps_are_read_per_worker(served):
    _, db, *_ = served
    store = ServiceStore(db)
    try:
        windows = store.query("SELECT * FROM windows ORDER BY window_index")
        widths = {r["workers"] for r in store.query(
            "SELECT DISTINCT workers FROM window_trajectories")}  # fmt: skip
    finally:
        store.close()
    assert len(windows) >= 6
    assert widths == {8}  # replayed and observed on the eight workers that run
    for window in windows:
        # the replayed JSQ is the recorded JSQ: no slots on the down worker, and the
        # offset engine's steps line up with the others' by time, not by number
        assert abs(window["fidelity_imbalance"] - 1) <= 0.01, window
        assert abs(window["fidelity_step"] - 1) <= 0.01, window


def test_calibration_is_scored_before_learning():
    """A predictor that memorises what it learnt looks perfect when scored on what it
    learnt, and knows nothing about requests it has not seen yet."""
    rng = np.random.default_rng(0)
    outputs = rng.integers(1, 400, size=600)
    keys = np.arange(600, dtype=np.int64)  # every prompt once

    class Memoriser(SurvivalPredictor):
        name = "memoriser"

        def __init__(self):
            super().__init__()
            self.seen = {}

        def observe_many(self, output_tokens, prompt_keys=None):
            self.seen.update(zip(prompt_keys.tolist(), output_tokens.tolist(), strict=True))

        def predict(self, active, horizon):
            truth = np.array([self.seen.get(int(k), -1) for k in active.prompt_keys])
            known = truth > 0
            remaining = truth - active.generated
            finish = np.where(known, (remaining <= horizon).astype(float), 0.5)
            contribution = np.where(known, np.minimum(remaining, horizon + 1), horizon + 1.0)
            from shadow.predict import Prediction

            return Prediction(contribution.astype(float), finish)

    in_sample = Memoriser()
    in_sample.observe_many(outputs, keys)
    assert calibrate(in_sample, outputs, keys, horizon=80).auc > 0.99
    assert prequential_calibrate(Memoriser(), outputs, keys, horizon=80).auc == pytest.approx(0.5)


def _two_worker_round():
    """A round of two requests on two workers of B = 4, one of them running one request."""
    from shadow.policies import FleetSnapshot, ReadyPool
    from shadow.policies.snapshot import ActiveSet

    snapshot = FleetSnapshot.from_active([4, 4], ActiveSet.from_arrays([0], [100], [3]))
    return snapshot, ReadyPool.from_arrays(["r1", "r2"], [50, 60])


def test_a_round_past_the_timeout_is_a_counted_error():
    """The timeout is the audit's, in the same CPU time as the latency: a round slower
    than `decision_timeout_ms` is counted and its choice kept for the audit."""
    from shadow.stream.audit import AuditConfig, Auditor

    snapshot, pool = _two_worker_round()
    late = Auditor("f", AuditConfig(policies=("jsq-pool", "slow-jsq"), decision_timeout_ms=2.0))
    round_ = late.run_round(0.0, snapshot, pool)
    assert [policy for policy, _ in round_.errors] == ["slow-jsq"]
    assert "timed out" in round_.errors[0][1] and round_.latency["slow-jsq"] >= 6.0
    assert round_.choices["slow-jsq"] == round_.choices["jsq-pool"] == {"r1": "1", "r2": "0"}


def test_a_collection_inside_a_round_is_not_the_policys_time():
    """A garbage collection that runs inside a policy's round walks the audit process's
    heap: it is left out of the round's time, so it neither times the policy out nor
    counts in its latency. The policy's own computation still does (the test above)."""
    import gc

    from shadow.stream.audit import AuditConfig, Auditor

    heap = [[i] for i in range(1_000_000)]  # a heap a collection takes tens of ms to walk
    started = time.thread_time()
    gc.collect()
    walk_ms = (time.thread_time() - started) * 1000.0
    assert walk_ms > 10.0, f"the heap is walked in {walk_ms:.1f} ms: too fast to tell"
    snapshot, pool = _two_worker_round()
    auditor = Auditor(
        "f", AuditConfig(policies=("jsq-pool", "collected-jsq"), decision_timeout_ms=5.0)
    )
    round_ = auditor.run_round(0.0, snapshot, pool)
    assert round_.errors == [], round_.errors
    assert round_.latency["collected-jsq"] < walk_ms / 4, (round_.latency, walk_ms)
    assert round_.choices["collected-jsq"] == round_.choices["jsq-pool"]
    del heap
