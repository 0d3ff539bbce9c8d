"""The gate over HTTP: a run on the service's live evidence (`GET` a dry run for the
`read` role, `POST` a recorded run for `operator`; what `shadow gate --url` calls and what
Argo Rollouts' web provider polls), Flagger's webhook (200 only on PASS), one metric's
explanation, the runs recorded for a fleet and one run's report."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from shadow.gate.command import GateRequest, judge_and_record, run_gate
from shadow.gate.report import explain as explain_metric
from shadow.gate.thresholds import Thresholds, ThresholdsError, thresholds_from_mapping
from shadow.policies import policy_names
from shadow.service.http.gate_schema import GateExplanation, report_responses
from shadow.service.http.responses import PAGE_MAX, invalid, rows_json
from shadow.service.http.state import State, Store
from shadow.storage import queries

router = APIRouter()


class DryRunBody(BaseModel):
    candidate: str
    baseline: str = "jsq-pool"
    since: float | None = None
    until: float | None = None


class GateRunBody(BaseModel):
    """A gate run to record (what `shadow gate --url` sends without --dry-run)."""

    candidate: str = Field(description="the policy to promote")
    baseline: str = Field("jsq-pool", description="the incumbent")
    since: float | None = Field(None, description="evidence from this time (Unix s)")
    until: float | None = Field(None, description="evidence before this time (Unix s)")
    thresholds: dict[str, Any] | None = Field(
        None, description="threshold overrides (the keys of `shadow gate --show-thresholds`)"
    )
    dry_run: bool = Field(False, description="recorded as a dry run: never changes a mode")
    horizon: int | None = Field(None, description="calibration horizon H (default: the service's)")


class FlaggerPayload(BaseModel):
    """What Flagger posts to a webhook; `metadata` is the webhook's own (`candidate`,
    `baseline` there override the query)."""

    name: str | None = None
    namespace: str | None = None
    phase: str | None = None
    metadata: dict[str, str] | None = None


Candidate = Annotated[str, Query(description="the policy to promote")]
Baseline = Annotated[str, Query(description="the incumbent")]
Since = Annotated[float | None, Query(description="evidence from this time (Unix s)")]
Until = Annotated[float | None, Query(description="evidence before this time (Unix s)")]
ThresholdsQuery = Annotated[str | None, Query(description="threshold overrides as a JSON object")]
HorizonQuery = Annotated[
    int | None, Query(description="calibration horizon H (default: the service's own H)")
]


def _horizon(state: State, asked: int | None) -> int:
    return state.settings.balance_route.horizon if asked is None else asked


def _request(
    fleet: str, candidate: str, baseline: str, since: float | None, until: float | None,
    thresholds: dict[str, Any] | str | None, dry_run: bool, where: str, horizon: int,
) -> GateRequest:  # fmt: skip
    """The run asked for, or a 422 naming the field and the problem. `horizon`: the
    calibration H (the request's, else the service's `[balance_route]` H)."""
    known = policy_names()  # now: a policy module may have registered more
    for name, value in (("candidate", candidate), ("baseline", baseline)):
        if value not in known:
            raise invalid([where, name], f"{name}: unknown policy {value!r}")
    if isinstance(thresholds, str):
        try:
            thresholds = json.loads(thresholds)
        except ValueError as error:
            raise invalid([where, "thresholds"], f"thresholds: not JSON: {error}") from None
    if thresholds is not None and not isinstance(thresholds, dict):
        raise invalid([where, "thresholds"], "thresholds: must be a JSON object")
    try:
        chosen = thresholds_from_mapping(thresholds) if thresholds else Thresholds()
    except (ThresholdsError, TypeError) as error:
        raise invalid([where, "thresholds"], f"thresholds: {error}") from None
    if horizon < 0:
        raise invalid([where, "horizon"], f"horizon: must be >= 0, got {horizon}")
    return GateRequest(fleet, candidate, baseline, since, until, chosen, dry_run, horizon)


def _run(store: Store, request: GateRequest) -> dict[str, Any]:
    """Judge, record, and answer the report with the recorded run's id and time."""
    report, run_id = judge_and_record(store, request)
    run = queries.gate_run(store, run_id)
    return {**report, "id": run_id, "ts": run["ts"] if run else time.time()}


@router.get("/v1/fleets/{fleet}/gate", responses=report_responses(200))
def gate_now(
    fleet: str, store: Store, state: State, candidate: Candidate, baseline: Baseline = "jsq-pool",
    since: Since = None, until: Until = None, thresholds: ThresholdsQuery = None,
    horizon: HorizonQuery = None,
) -> JSONResponse:  # fmt: skip
    """Run the gate on the service's live evidence now, recorded as a dry run (it never
    changes a mode, so the `read` role may ask). 200 with the report whatever the verdict:
    the verdict is in the body (`verdict`, `exit_code`)."""
    request = _request(fleet, candidate, baseline, since, until, thresholds, True, "query",
                       _horizon(state, horizon))  # fmt: skip
    return JSONResponse(_run(store, request))


@router.post("/v1/fleets/{fleet}/gate", responses=report_responses(200))
def gate_record(fleet: str, body: GateRunBody, store: Store, state: State) -> JSONResponse:
    """Run the gate on the live evidence and record it (`operator`): a FAIL is remembered on
    the fleet's mode and promoting anyway is refused. 200 with the report whatever the
    verdict."""
    request = _request(fleet, body.candidate, body.baseline, body.since, body.until,
                       body.thresholds, body.dry_run, "body",
                       _horizon(state, body.horizon))  # fmt: skip
    return JSONResponse(_run(store, request))


@router.post("/v1/fleets/{fleet}/gate/flagger", responses=report_responses(200, 412))
def gate_flagger(
    fleet: str, store: Store, state: State, payload: FlaggerPayload | None = None,
    candidate: Annotated[str | None, Query(description="the policy to promote")] = None,
    baseline: Baseline = "jsq-pool",
) -> JSONResponse:  # fmt: skip
    """Flagger's webhook (`pre-rollout`, `confirm-promotion`): 200 only on PASS, 412 with the
    report otherwise. A dry run (needs only `read`: Flagger sends no header)."""
    metadata = (payload.metadata if payload else None) or {}
    chosen = metadata.get("candidate", candidate)
    if chosen is None:
        raise invalid(["query", "candidate"], "candidate: required (query or metadata)")
    request = _request(fleet, chosen, metadata.get("baseline", baseline), None, None, None,
                       True, "query", _horizon(state, None))  # fmt: skip
    report = _run(store, request)
    return JSONResponse(report, status_code=200 if report["verdict"] == "PASS" else 412)


@router.get("/v1/fleets/{fleet}/gate/explain", response_model=GateExplanation)
def gate_explain(
    fleet: str, store: Store, state: State, metric: str, candidate: Candidate,
    baseline: Baseline = "jsq-pool", since: Since = None, until: Until = None,
    thresholds: ThresholdsQuery = None, horizon: HorizonQuery = None,
) -> dict[str, str]:  # fmt: skip
    """`shadow gate --explain METRIC`: one rule's evaluation and its bootstrap (nothing is
    recorded)."""
    request = _request(fleet, candidate, baseline, since, until, thresholds, True, "query",
                       _horizon(state, horizon))  # fmt: skip
    try:
        text = explain_metric(run_gate(store, request), metric)
    except ValueError as error:
        raise invalid(["query", "metric"], f"metric: {error}") from None
    return {"metric": metric, "text": text}


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
def gate_dry_run(fleet: str, body: DryRunBody, store: Store, state: State) -> dict[str, Any]:
    """Run the gate on the service's own evidence now; recorded as a dry run (it never
    changes a mode). The UI's button; `GET /v1/fleets/{fleet}/gate` is the same for `read`.
    Calibration is scored at the service's own `[balance_route]` H."""
    request = _request(fleet, body.candidate, body.baseline, body.since, body.until, None,
                       True, "body", state.settings.balance_route.horizon)  # fmt: skip
    report, run_id = judge_and_record(store, request)
    return {**report, "id": run_id, "ts": time.time()}
