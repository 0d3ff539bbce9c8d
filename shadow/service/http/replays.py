"""Runs stored by `shadow replay`: the list with per-policy summaries, and one run with
its step series bucketed for a chart."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from shadow.service.http.responses import PAGE_MAX, iso, rows_json
from shadow.service.http.state import Store
from shadow.storage import queries

router = APIRouter()


@router.get("/v1/replays")
def replays(
    store: Store,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Runs stored by `shadow replay`, newest first, with their per-policy summaries."""
    total, runs = queries.replay_runs_page(store, limit, offset)
    by_run: dict[int, list[dict[str, Any]]] = {}
    for s in rows_json(queries.replay_summaries(store, [r["id"] for r in runs])):
        by_run.setdefault(s["run_id"], []).append(s)
    items = []
    for run in runs:
        run["created_at"] = iso(run["created_at"])
        run["policies"] = by_run.get(run["id"], [])
        items.append(run)
    return {"total": total, "limit": limit, "offset": offset, "items": rows_json(items)}


@router.get("/v1/replays/{run_id}")
def replay_run(
    run_id: int, store: Store, points: Annotated[int, Query(ge=10, le=20_000)] = 600
) -> dict[str, Any]:
    """One stored replay: its summaries and per-policy step series, bucketed."""
    run = queries.replay_run(store, run_id)
    if run is None:
        raise HTTPException(404, f"no replay run {run_id}")
    run["created_at"] = iso(run["created_at"])
    run["config"] = json.loads(run.pop("config_json"))
    summaries = rows_json(queries.replay_run_summaries(store, run_id))
    series: dict[str, Any] = {}
    for entry in queries.replay_step_counts(store, run_id):
        buckets = queries.replay_step_buckets(store, run_id, entry["policy"], points, entry["n"])
        series[entry["policy"]] = {
            "t_ms": [round(float(b["t"]), 3) for b in buckets],
            "imbalance": [round(float(b["imbalance"]), 1) for b in buckets],
            "step_ms": [round(float(b["step_ms"]), 3) for b in buckets],
            "active": [round(float(b["active"]), 2) for b in buckets],
        }
    return {**rows_json([run])[0], "summaries": summaries, "series": series}
