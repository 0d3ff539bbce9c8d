"""The fleets the service mirrors: the list with each fleet's health at a glance, the
mirror now, one request's history, engine telemetry and the step-model fit."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException

from shadow.policies.fscore import gap, imbalance
from shadow.service.http.modes import mode_json
from shadow.service.http.responses import clean, rows_json
from shadow.service.http.state import AppState, State, Store
from shadow.storage import queries

router = APIRouter()


def _fleets(state: AppState) -> list[dict[str, Any]]:
    store = state.runtime.store
    counts = queries.violation_counts(store)
    gates: dict[str, dict[str, Any]] = {}
    for fleet, row in queries.latest_gate_runs(store).items():
        report = json.loads(row.pop("report"))
        gates[fleet] = {**row, "dry_run": bool(report.get("dry_run")),
                        "deciding_rule": report.get("deciding_rule")}  # fmt: skip
    windows = queries.window_counts(store)
    out = []
    for name, fleet in state.runtime.pipeline.fleets.items():
        mirror = fleet.mirror
        out.append(
            {
                "fleet": name,
                "workers": len(mirror.order),
                "active": int(sum(len(w.active) for w in mirror.order)),
                "pool": len(mirror.pool),
                "incumbent": fleet.incumbent,
                "last_event_ts": mirror.now,
                "violations": int(counts.get(name, {}).get("violations", 0)),
                "critical_violations": int(counts.get(name, {}).get("critical", 0)),
                "mode": mode_json(state.modes.get(name)),
                "gate": gates.get(name),
                "telemetry": state.freshness(name),
                "windows": int(windows.get(name, 0)),
                # the decision audit's sampler: skipped > 0 means the decisions are a sample
                "audit": {
                    "audited": fleet.sampler.audited,
                    "skipped": fleet.sampler.skipped,
                    "stride": fleet.sampler.stride,
                },
            }
        )
    return out


@router.get("/v1/fleets/{fleet}/requests/{request_id}")
def request_history(fleet: str, request_id: str, store: Store) -> dict[str, Any]:
    """Everything stored about one request: lifecycle events and latest progress."""
    events = queries.request_events(store, fleet, request_id)
    progress = store.latest_progress(fleet, request_id)
    if not events and not progress:
        raise HTTPException(404, f"no request {request_id!r} in fleet {fleet!r}")
    return {
        "request_id": request_id,
        "events": rows_json(events),
        "progress": rows_json(progress)[0] if progress else None,
    }


@router.get("/v1/fleets")
def fleets(state: State) -> list[dict[str, Any]]:
    return _fleets(state)


@router.get("/v1/fleets/{fleet}/snapshot")
def snapshot(fleet: str, state: State) -> dict[str, Any]:
    """The mirror now: per worker capacity, state, active requests and KV load."""
    found = state.fleet_state(fleet)
    mirror = found.mirror
    with state.runtime.pipeline.lock:
        workers = [
            {
                "worker": w.worker_id,
                "capacity": w.capacity,
                "state": w.state,
                "active": len(w.active),
                "kv_tokens": w.load,
                "steps": w.steps,
            }
            for w in mirror.order
        ]
        loads = mirror.loads()
    return {
        "fleet": fleet,
        "ts": mirror.now,
        "workers": workers,
        "pool": len(mirror.pool),
        "imbalance": imbalance(loads) if len(loads) else None,
        "gap": gap(loads) if len(loads) else None,
        "engine_steps": found.engine_steps,
        "state_mismatches": found.state_mismatches,
        "late_events": found.late_events,
        "late_by_source": [
            {"source": source, "type": kind, "events": count}
            for (source, kind), count in sorted(found.late_by_source.items())
        ],
    }


@router.get("/v1/fleets/{fleet}/telemetry")
def telemetry(fleet: str, state: State) -> dict[str, Any]:
    """Engine scrapes: per worker the last sample, its age, staleness and failures,
    and what the mirror held when the sample was compared."""
    poller = state.poller
    found = state.runtime.pipeline.fleets.get(fleet)
    compared = found.last_sample if found is not None else {}
    engines = {}
    for worker, status in (poller.status() if poller is not None else {}).items():
        sample = status.get("sample")
        engines[worker] = {
            "stale": status["stale"],
            "age_s": clean(status.get("age_s")),
            "failures": status.get("failures", 0),
            "last_error": status.get("last_error"),
            "running": None if sample is None else sample["running"],
            "waiting": None if sample is None else sample["waiting"],
            "kv_usage": None if sample is None else sample["kv_usage"],
            "mirror_active_at_sample": compared.get(worker, (None, None, None))[2],
        }
    return {"fleet": fleet, "polling": poller is not None, "engines": engines}


@router.get("/v1/fleets/{fleet}/stepmodel")
def stepmodel(fleet: str, state: State) -> dict[str, Any]:
    """The latest step-model fit (`T = a * max L + b`), or the defaults if none yet."""
    fit = queries.latest_step_fit(state.runtime.store, fleet)
    if fit is not None:
        return rows_json([fit])[0]
    return {
        "fleet": fleet,
        "a_ms_per_token": state.settings.step_model.a_ms_per_token,
        "b_ms": state.settings.step_model.b_ms,
        "fallback": True,
        "reason": "no fit yet: configured defaults",
        "n": 0,
    }
