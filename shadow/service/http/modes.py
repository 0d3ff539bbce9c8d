"""A fleet's mode (read, and the operator's actions on it), `POST /v1/route` that answers
by it, and the audit log those actions are written to."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from shadow.gate.record import last_verdict
from shadow.modes import FleetMode, ModeError, auditlog, freeze, reset, resume, set_mode
from shadow.service.http.responses import PAGE_MAX, invalid
from shadow.service.http.routing import RouteRequest
from shadow.service.http.state import State

router = APIRouter()


class RouteItem(BaseModel):
    request_id: str
    prompt_tokens: int = Field(ge=0)
    prompt_hash: str | None = None


class RouteBody(BaseModel):
    fleet: str = "default"
    requests: list[RouteItem] = Field(min_length=1, max_length=4096)


class ModeAction(BaseModel):
    action: Literal["set", "freeze", "resume", "reset"]
    reason: str = Field(min_length=1)
    mode: Literal["shadow", "live", "fallback", "latched"] | None = None
    policy: str | None = None
    actor: str = "api"


def mode_json(mode: FleetMode) -> dict[str, Any]:
    return {
        "fleet": mode.fleet,
        "mode": mode.mode.value,
        "policy": mode.policy,
        "since": mode.since,
        "trips": list(mode.trips),
        "healthy_windows": mode.healthy_windows,
        "frozen": mode.frozen,
        "cooldown_until": mode.cooldown_until,
        "last_gate_verdict": mode.last_gate_verdict,
    }


@router.post("/v1/route")
def route(body: RouteBody, state: State) -> dict[str, Any]:
    """Where to send ready requests: by the promoted policy in `live`, by Round-Robin in
    `fallback`/`latched`; in `shadow` the incumbent decides and the answer says so."""
    requests = [RouteRequest(r.request_id, r.prompt_tokens, r.prompt_hash) for r in body.requests]
    return state.running.router.route(body.fleet, requests).as_json()


@router.get("/v1/fleets/{fleet}/mode")
def get_mode(fleet: str, state: State) -> dict[str, Any]:
    return mode_json(state.modes.get(fleet))


@router.post("/v1/fleets/{fleet}/mode")
def change_mode(fleet: str, body: ModeAction, state: State) -> dict[str, Any]:
    """Operator actions (`set`, `freeze`, `resume`, `reset`), each with a reason;
    promoting after a FAIL verdict is refused (409)."""
    modes = state.modes
    action = {"set": set_mode, "freeze": freeze, "resume": resume, "reset": reset}[body.action]
    args: list[Any] = [body.reason]
    kwargs: dict[str, Any] = {}
    if body.action == "set":
        if body.mode is None:
            raise invalid(["body", "mode"], "action 'set' needs a mode")
        args = [body.mode, body.reason, body.policy]
        verdict = last_verdict(
            state.runtime.store.engine, fleet, body.policy or modes.get(fleet).policy
        )
        if verdict is not None:
            kwargs["last_gate_verdict"] = verdict
    try:
        modes.apply(fleet, action, *args, actor=body.actor, **kwargs)
    except ModeError as error:
        raise HTTPException(409, str(error)) from None
    except ValueError as error:
        raise invalid(["body"], str(error)) from None
    return mode_json(modes.get(fleet))


@router.get("/v1/audit/verify")
def audit_verify(state: State) -> dict[str, Any]:
    """Recompute the audit log's hash chain."""
    result = auditlog.verify(state.runtime.store.engine)
    return {"ok": result.ok, "rows": result.rows, "first_bad_seq": result.first_bad_seq,
            "problem": result.problem}  # fmt: skip


@router.get("/v1/audit/log")
def audit_log(
    state: State,
    fleet: str | None = None,
    kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
) -> dict[str, Any]:
    """Audit-log entries, newest first (mode transitions, operator actions, gate runs)."""
    entries = auditlog.entries(state.runtime.store.engine, fleet, limit, kind=kind)
    return {
        "items": [
            {k: getattr(e, k) for k in ("seq", "ts", "fleet", "kind", "actor", "reason", "payload")}
            for e in entries
        ]
    }
