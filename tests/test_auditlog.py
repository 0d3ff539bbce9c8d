"""The hash-chained audit log: appends, verification and tamper detection on real DuckDB."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from shadow.modes import auditlog
from shadow.storage import open_database


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with open_database(tmp_path / "audit.duckdb") as db:
        yield db.engine


def _fill(engine: Engine, n: int) -> list[auditlog.AuditEntry]:
    kinds = [auditlog.KIND_GATE_RUN, auditlog.KIND_MODE_TRANSITION, auditlog.KIND_OPERATOR_ACTION]
    return [
        auditlog.append(
            engine,
            ts=1000 + i,  # an int: must hash the same once read back as a DOUBLE
            fleet="a" if i % 2 else None,
            kind=kinds[i % 3],
            actor="tester",
            reason=None if i == 0 else f"reason {i} — ünïcode",
            payload={"i": i, "x": 0.1 * i, "nested": {"b": [1, 2], "a": (3, 4)}},
        )
        for i in range(n)
    ]


def test_chain_links_and_verifies(engine: Engine) -> None:
    assert auditlog.verify(engine) == auditlog.VerifyResult(True, 0)
    rows = _fill(engine, 5)
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0].prev_hash == auditlog.GENESIS_HASH == "0" * 64
    for prev, cur in itertools.pairwise(rows):
        assert cur.prev_hash == prev.hash
    assert rows[0].payload["nested"]["a"] == [3, 4]  # as stored, not as given
    assert auditlog.verify(engine) == auditlog.VerifyResult(True, 5, None, None)


def test_hash_is_sha256_of_prev_hash_and_canonical_json(engine: Engine) -> None:
    import hashlib

    entry = auditlog.append(
        engine, ts=5.5, fleet="f", kind="gate_run", actor="ci", reason="r", payload={"b": 1, "a": 2}
    )
    body = '[1,5.5,"f","gate_run","ci","r",{"a":2,"b":1}]'
    assert entry.hash == hashlib.sha256(("0" * 64 + body).encode()).hexdigest()


def test_entries_newest_first_filtered(engine: Engine) -> None:
    _fill(engine, 6)
    got = auditlog.entries(engine)
    assert [e.seq for e in got] == [6, 5, 4, 3, 2, 1]
    assert [e.seq for e in auditlog.entries(engine, fleet="a", limit=2)] == [6, 4]
    assert [e.seq for e in auditlog.entries(engine, kind="gate_run")] == [4, 1]
    assert got[-1].payload["x"] == 0.0 and got[-1].reason is None


@pytest.mark.parametrize(
    ("sql", "bad_seq", "problem"),
    [
        ("UPDATE audit_log SET payload = '{\"i\": 99}' WHERE seq = 3", 3, "hash"),
        ("UPDATE audit_log SET reason = 'edited' WHERE seq = 2", 2, "hash"),
        ("UPDATE audit_log SET ts = ts + 1 WHERE seq = 4", 4, "hash"),
        ("UPDATE audit_log SET hash = repeat('a', 64) WHERE seq = 4", 4, "hash"),
        ("DELETE FROM audit_log WHERE seq = 3", 4, "missing"),
        ("DELETE FROM audit_log WHERE seq = 1", 2, "missing"),
        ("UPDATE audit_log SET payload = 'not json' WHERE seq = 5", 5, "JSON"),
        ("UPDATE audit_log SET prev_hash = repeat('0', 64) WHERE seq = 2", 2, "prev_hash"),
    ],
)
def test_tampering_is_found_at_the_right_seq(
    engine: Engine, sql: str, bad_seq: int, problem: str
) -> None:
    _fill(engine, 6)
    with engine.begin() as conn:
        conn.execute(text(sql))
    result = auditlog.verify(engine)
    assert not result.ok
    assert result.first_bad_seq == bad_seq
    assert result.problem is not None and problem in result.problem


def test_reordered_seq_is_found(engine: Engine) -> None:
    _fill(engine, 6)
    with engine.begin() as conn:  # swap rows 3 and 4 via a free seq
        conn.execute(text("UPDATE audit_log SET seq = 100 WHERE seq = 3"))
        conn.execute(text("UPDATE audit_log SET seq = 3 WHERE seq = 4"))
        conn.execute(text("UPDATE audit_log SET seq = 4 WHERE seq = 100"))
    result = auditlog.verify(engine)
    assert (result.ok, result.first_bad_seq) == (False, 3)


def test_rehashed_edit_breaks_the_next_link(engine: Engine) -> None:
    """Recomputing the edited row's own hash is not enough: the next row's link breaks."""
    rows = _fill(engine, 4)
    payload = {"i": 99}
    forged = auditlog.compute_hash(
        rows[1].prev_hash,
        seq=2,
        ts=rows[1].ts,
        fleet=rows[1].fleet,
        kind=rows[1].kind,
        actor=rows[1].actor,
        reason=rows[1].reason,
        payload=payload,
    )
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE audit_log SET payload = :p, hash = :h WHERE seq = 2"),
            {"p": json.dumps(payload), "h": forged},
        )
    result = auditlog.verify(engine)
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert result.problem is not None and "prev_hash" in result.problem


def test_append_in_caller_transaction_rolls_back_together(engine: Engine) -> None:
    _fill(engine, 2)
    with pytest.raises(RuntimeError, match="boom"), engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO gate_runs (ts, fleet, candidate, baseline, verdict, exit_code, "
                "report) VALUES (1, 'a', 'br0', 'jsq', 'PASS', 0, '{}')"
            )
        )
        entry = auditlog.append(
            conn, ts=1, fleet="a", kind="gate_run", actor="ci", reason=None, payload={"v": 1}
        )
        assert entry.seq == 3
        assert auditlog.verify(conn).rows == 3  # visible inside the transaction
        raise RuntimeError("boom")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gate_runs")).scalar_one() == 0
    assert auditlog.verify(engine) == auditlog.VerifyResult(True, 2)
    # The rolled-back seq is reused: no gap.
    assert auditlog.append(engine, ts=2, fleet=None, kind="k", actor="a", reason=None, payload={})
    assert auditlog.verify(engine) == auditlog.VerifyResult(True, 3)


def test_several_appends_in_one_transaction_chain(engine: Engine) -> None:
    with engine.begin() as conn:
        a = auditlog.append(conn, ts=1, fleet="f", kind="k", actor="x", reason=None, payload={})
        b = auditlog.append(conn, ts=1, fleet="f", kind="k", actor="x", reason=None, payload={})
    assert (a.seq, b.seq, b.prev_hash) == (1, 2, a.hash)
    assert auditlog.verify(engine).ok


def test_concurrent_appenders_cannot_fork_the_chain(engine: Engine) -> None:
    """Both claim seq 1; DuckDB refuses the second commit, so one chain survives."""
    failures = 0
    with engine.connect() as c1, engine.connect() as c2:
        t1, t2 = c1.begin(), c2.begin()
        auditlog.append(c1, ts=1, fleet=None, kind="k", actor="one", reason=None, payload={})
        auditlog.append(c2, ts=1, fleet=None, kind="k", actor="two", reason=None, payload={})
        for txn in (t2, t1):
            try:
                txn.commit()
            except DBAPIError:
                failures += 1
    assert failures == 1
    assert auditlog.verify(engine) == auditlog.VerifyResult(True, 1)
    assert [e.actor for e in auditlog.entries(engine)] == ["two"]


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": ""},
        {"actor": ""},
        {"payload": {"x": float("nan")}},
        {"payload": {"x": object()}},
    ],
)
def test_invalid_appends_are_refused(engine: Engine, bad: dict) -> None:
    args = {"ts": 1.0, "fleet": None, "kind": "k", "actor": "a", "reason": None, "payload": {}}
    with pytest.raises((ValueError, TypeError)):
        auditlog.append(engine, **(args | bad))
    assert auditlog.verify(engine).rows == 0
