"""Every gate run is kept: a `gate_runs` row with the whole report, one audit-log row, and
the verdict remembered on the fleet's mode (promoting anyway is refused after a FAIL)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Engine, text

from shadow.gate.source import EvidenceSource
from shadow.modes import ModeStore, auditlog, note_gate_verdict


def record_gate_run(store: EvidenceSource, report: dict[str, Any], *, dry_run: bool) -> int:
    now = time.time()
    fleet = report["evidence"]["fleet"]
    with store.engine.begin() as conn:
        run_id = conn.execute(text("SELECT coalesce(max(id), 0) + 1 FROM gate_runs")).scalar()
        conn.execute(
            text(
                "INSERT INTO gate_runs (id, ts, fleet, candidate, baseline, verdict, exit_code, "
                "report) VALUES (:id, :ts, :fleet, :candidate, :baseline, :verdict, :code, "
                ":report)"
            ),
            {
                "id": run_id,
                "ts": now,
                "fleet": fleet,
                "candidate": report["evidence"]["candidate"],
                "baseline": report["evidence"]["baseline"],
                "verdict": report["verdict"],
                "code": report["exit_code"],
                "report": json.dumps(report, sort_keys=True),
            },
        )
        auditlog.append(
            conn,
            ts=now,
            fleet=fleet,
            kind=auditlog.KIND_GATE_RUN,
            actor="shadow gate",
            reason=report["deciding_rule"],
            payload={
                "gate_run": run_id,
                "verdict": report["verdict"],
                "candidate": report["evidence"]["candidate"],
                "baseline": report["evidence"]["baseline"],
                "config_hash": report["config_hash"],
                "dry_run": dry_run,
            },
        )
    if not dry_run:
        ModeStore(store.engine).apply(
            fleet, note_gate_verdict, report["verdict"], actor="shadow gate", now=now
        )
    return int(run_id)


def last_verdict(engine: Engine, fleet: str, policy: str | None) -> str | None:
    """The latest non-dry-run gate verdict for promoting `policy` on `fleet`."""
    if policy is None:
        return None
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT verdict, report FROM gate_runs WHERE fleet = :fleet AND candidate = "
                ":policy ORDER BY id DESC"
            ),
            {"fleet": fleet, "policy": policy},
        ).fetchall()
    for verdict, report in rows:
        if not json.loads(report).get("dry_run"):
            return verdict
    return None
