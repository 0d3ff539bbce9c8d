"""Append-only, hash-chained audit log (GATE.md: every transition, gate run and operator
action is one row carrying the hash of the previous one, so tampering shows).

Each row's ``hash`` is ``sha256(prev_hash + canonical JSON of [seq, ts, fleet, kind,
actor, reason, payload])``; the first row's ``prev_hash`` is 64 zeros. ``seq`` is dense
(1, 2, 3, ...), assigned as ``max(seq) + 1`` inside the caller's transaction, so a
rolled-back append leaves no gap and a gap always means a deleted row.

Limits: the chain proves the rows it has were not altered, removed from the middle or
reordered; it cannot show that the *newest* rows were truncated, nor stop someone who
rewrites every hash after an edit. Anchor the latest hash elsewhere (a ticket, a log
shipper) when that matters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, insert, select

from shadow.storage.models import AuditLogRow

GENESIS_HASH = "0" * 64
"""``prev_hash`` of the first row."""

KIND_GATE_RUN = "gate_run"
KIND_MODE_TRANSITION = "mode_transition"
KIND_OPERATOR_ACTION = "operator_action"

_TABLE = AuditLogRow.__table__


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row as stored (``payload`` decoded)."""

    seq: int
    ts: float
    fleet: str | None
    kind: str
    actor: str
    reason: str | None
    payload: dict[str, Any]
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of :func:`verify`: ``first_bad_seq`` and ``problem`` are None when ok."""

    ok: bool
    rows: int
    first_bad_seq: int | None = None
    problem: str | None = None


def _canonical(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, no NaN (not JSON)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def compute_hash(
    prev_hash: str,
    *,
    seq: int,
    ts: float,
    fleet: str | None,
    kind: str,
    actor: str,
    reason: str | None,
    payload: Mapping[str, Any],
) -> str:
    """The chained hash of one row (exposed so other tools can check rows themselves)."""
    body = _canonical([seq, ts, fleet, kind, actor, reason, payload])
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def append(
    conn_or_engine: Connection | Engine,
    *,
    ts: float,
    fleet: str | None,
    kind: str,
    actor: str,
    reason: str | None,
    payload: Mapping[str, Any],
) -> AuditEntry:
    """Append one row and return it.

    Given a ``Connection``, the row is written in the caller's current transaction (it
    commits or rolls back with the caller's other writes); given an ``Engine``, in a
    transaction of its own. Two transactions appending at once both claim the same
    ``seq``; DuckDB rejects the second (primary key / write conflict), so the chain never
    forks: retry the losing transaction.
    """
    if not kind:
        raise ValueError("audit kind must be non-empty")
    if not actor:
        raise ValueError("audit actor must be non-empty")
    # Round-trip through canonical JSON so what is hashed is exactly what verify() will
    # read back (tuples become lists, ints stay ints; NaN or non-JSON values raise here).
    body = json.loads(_canonical(dict(payload)))
    ts = float(ts)  # stored as DOUBLE: an int ts would hash differently once read back
    if isinstance(conn_or_engine, Engine):
        with conn_or_engine.begin() as conn:
            return _append(conn, ts, fleet, kind, actor, reason, body)
    return _append(conn_or_engine, ts, fleet, kind, actor, reason, body)


def _append(
    conn: Connection,
    ts: float,
    fleet: str | None,
    kind: str,
    actor: str,
    reason: str | None,
    payload: dict[str, Any],
) -> AuditEntry:
    last = conn.execute(
        select(_TABLE.c.seq, _TABLE.c.hash).order_by(_TABLE.c.seq.desc()).limit(1)
    ).first()
    seq, prev_hash = (1, GENESIS_HASH) if last is None else (int(last[0]) + 1, str(last[1]))
    digest = compute_hash(
        prev_hash,
        seq=seq,
        ts=ts,
        fleet=fleet,
        kind=kind,
        actor=actor,
        reason=reason,
        payload=payload,
    )
    conn.execute(
        insert(_TABLE).values(
            seq=seq,
            ts=ts,
            fleet=fleet,
            kind=kind,
            actor=actor,
            reason=reason,
            payload=_canonical(payload),
            prev_hash=prev_hash,
            hash=digest,
        )
    )
    return AuditEntry(seq, ts, fleet, kind, actor, reason, payload, prev_hash, digest)


def verify(conn_or_engine: Connection | Engine) -> VerifyResult:
    """Recompute the whole chain; report the first row whose seq, link or hash is wrong.

    ``rows`` is the number of rows in the log. A deleted row shows as a seq gap at the
    row after it, an altered row (payload, hash, any column) as a hash mismatch at that
    row, and a row whose ``hash`` was rewritten to cover an edit as a broken link at the
    next row.
    """
    if isinstance(conn_or_engine, Engine):
        with conn_or_engine.connect() as conn:
            return _verify(conn)
    return _verify(conn_or_engine)


def _verify(conn: Connection) -> VerifyResult:
    rows = conn.execute(select(_TABLE).order_by(_TABLE.c.seq)).mappings().all()
    expected_prev = GENESIS_HASH
    for expected_seq, row in enumerate(rows, start=1):
        problem = _row_problem(row, expected_seq, expected_prev)
        if problem is not None:
            return VerifyResult(False, len(rows), int(row["seq"]), problem)
        expected_prev = row["hash"]
    return VerifyResult(True, len(rows))


def _row_problem(row: Mapping[str, Any], expected_seq: int, expected_prev: str) -> str | None:
    """Why ``row`` breaks the chain, or None."""
    seq = int(row["seq"])
    if seq != expected_seq:
        return f"seq {seq} where {expected_seq} was expected (row missing)"
    if row["prev_hash"] != expected_prev:
        return "prev_hash does not match the previous row's hash"
    try:
        payload = json.loads(row["payload"])
    except (TypeError, ValueError) as exc:
        return f"payload is not valid JSON: {exc}"
    digest = compute_hash(
        row["prev_hash"],
        seq=seq,
        ts=float(row["ts"]),
        fleet=row["fleet"],
        kind=row["kind"],
        actor=row["actor"],
        reason=row["reason"],
        payload=payload,
    )
    if row["hash"] != digest:
        return "hash does not match the row's contents"
    return None


def entries(
    conn_or_engine: Connection | Engine,
    fleet: str | None = None,
    limit: int = 100,
    *,
    kind: str | None = None,
) -> list[AuditEntry]:
    """The newest ``limit`` rows, newest first, optionally of one fleet and/or kind."""
    stmt = select(_TABLE).order_by(_TABLE.c.seq.desc()).limit(limit)
    if fleet is not None:
        stmt = stmt.where(_TABLE.c.fleet == fleet)
    if kind is not None:
        stmt = stmt.where(_TABLE.c.kind == kind)
    if isinstance(conn_or_engine, Engine):
        with conn_or_engine.connect() as conn:
            rows = conn.execute(stmt).mappings().all()
    else:
        rows = conn_or_engine.execute(stmt).mappings().all()
    return [
        AuditEntry(
            seq=int(r["seq"]),
            ts=float(r["ts"]),
            fleet=r["fleet"],
            kind=r["kind"],
            actor=r["actor"],
            reason=r["reason"],
            payload=json.loads(r["payload"]),
            prev_hash=r["prev_hash"],
            hash=r["hash"],
        )
        for r in rows
    ]
