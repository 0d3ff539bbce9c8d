"""Gate runs recorded for a fleet, one run's report, and a dry run on demand."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel

from shadow import __version__
from shadow.policies import POLICY_NAMES
from shadow.service.http.responses import PAGE_MAX, invalid, rows_json
from shadow.service.http.state import Store
from shadow.storage import queries

router = APIRouter()


class DryRunBody(BaseModel):
    candidate: str
    baseline: str = "jsq-pool"
    since: float | None = None
    until: float | None = None


@router.get("/v1/fleets/{fleet}/gate/runs")
def gate_runs(
    fleet: str,
    store: Store,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Gate verdicts recorded for the fleet, newest first."""
    total, rows = queries.gate_runs_page(store, fleet, limit, offset)
    items = []
    for row in rows:
        report = json.loads(row.pop("report"))
        row["dry_run"] = bool(report.get("dry_run"))
        row["deciding_rule"] = report.get("deciding_rule")
        items.append(row)
    return {"total": total, "limit": limit, "offset": offset, "items": rows_json(items)}


@router.get("/v1/gate/runs/{run_id}")
def gate_run(run_id: int, store: Store) -> dict[str, Any]:
    run = queries.gate_run(store, run_id)
    if run is None:
        raise HTTPException(404, f"no gate run {run_id}")
    return {**json.loads(run["report"]), "id": run["id"], "ts": run["ts"]}


@router.post("/v1/fleets/{fleet}/gate/dry-run")
def gate_dry_run(fleet: str, body: DryRunBody, store: Store) -> dict[str, Any]:
    """Run the gate on the service's own evidence now; recorded as a dry run (it never
    changes a mode)."""
    from shadow.gate.collect import collect_evidence
    from shadow.gate.record import record_gate_run
    from shadow.gate.verdict import decide

    for name, value in (("candidate", body.candidate), ("baseline", body.baseline)):
        if value not in POLICY_NAMES:
            raise invalid(["body", name], f"{name}: unknown policy {value!r}")
    evidence = collect_evidence(
        store, fleet=fleet, candidate=body.candidate, baseline=body.baseline,
        since=body.since, until=body.until,
    )  # fmt: skip
    report = decide(evidence).as_json(__version__)
    report["dry_run"] = True
    run_id = record_gate_run(store, report, dry_run=True)
    return {**report, "id": run_id, "ts": time.time()}
