"""The decision audit (one row per dispatch and policy, and one dispatch with its
snapshot) and the invariant violations (the list and their timeline)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query

from shadow.service.http.responses import PAGE_MAX, rows_json
from shadow.service.http.state import Store
from shadow.storage import queries

router = APIRouter()

CHOICE_KEYS = ("policy", "choice", "agrees", "f_br0_choice", "f_brh_choice", "latency_ms")
SortKey = Literal[
    "ts", "regret", "prompt_tokens", "latency_ms", "request_id", "policy", "incumbent_worker",
    "choice",
]  # fmt: skip


def _page_json(total: int, params: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"total": total, "limit": params["limit"], "offset": params["offset"],
            "items": rows_json(rows)}  # fmt: skip


@router.get("/v1/fleets/{fleet}/decisions")
def decisions(
    fleet: str,
    store: Store,
    disagreements_only: bool = False,
    policy: str | None = None,
    worker: str | None = None,
    min_regret: float | None = None,
    since: float | None = None,
    until: float | None = None,
    sort: SortKey = "ts",
    order: Literal["asc", "desc"] = "desc",
    snapshot: bool = True,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """The decision audit (one row per dispatch and policy), filtered, sorted and
    paginated. `regret` is the BR-0 F-score the incumbent's choice left on the table."""
    where = ["fleet = :fleet"]
    params: dict[str, Any] = {"fleet": fleet, "limit": limit, "offset": offset}
    if disagreements_only:
        where.append("NOT agrees")
    if policy is not None:
        where.append("policy = :policy")
        params["policy"] = policy
    if worker is not None:
        where.append("(incumbent_worker = :worker OR choice = :worker)")
        params["worker"] = worker
    if min_regret is not None:
        where.append("f_br0_best - f_br0_incumbent >= :min_regret")
        params["min_regret"] = min_regret
    in_range, range_params = queries.time_range("ts", since, until)
    where += in_range
    params.update(range_params)
    column = "f_br0_best - f_br0_incumbent" if sort == "regret" else sort
    direction = "ASC" if order == "asc" else "DESC"
    table = queries.source(store, "decisions", since, until)
    total, rows = queries.page(
        store, table, where, params,
        f"{column} {direction} NULLS LAST, ingest_id {direction}, policy",
        (queries.DECISION_FIELDS if snapshot else queries.DECISION_COLUMNS_BUT_SNAPSHOT)
        + ", f_br0_best - f_br0_incumbent AS regret",
    )  # fmt: skip
    if snapshot:
        queries.with_snapshots(store, table, fleet, rows)
    return _page_json(total, params, rows)


@router.get("/v1/fleets/{fleet}/violations")
def violations(
    fleet: str,
    store: Store,
    kind: str | None = None,
    severity: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Invariant violations, newest first, by kind, severity and time."""
    in_range, range_params = queries.time_range("ts", since, until)
    where = ["fleet = :fleet", *in_range]
    params: dict[str, Any] = {"fleet": fleet, "limit": limit, "offset": offset, **range_params}
    if kind is not None:
        where.append("kind = :kind")
        params["kind"] = kind
    if severity is not None:
        where.append("severity = :severity")
        params["severity"] = severity
    table = queries.source(store, "violations", since, until)
    total, rows = queries.page(store, table, where, params, "ts DESC, ingest_id DESC")
    return _page_json(total, params, rows)


@router.get("/v1/fleets/{fleet}/decisions/{ingest_id}")
def decision(fleet: str, ingest_id: int, store: Store) -> dict[str, Any]:
    """One audited dispatch: the frozen snapshot and every policy's choice on it."""
    rows = queries.dispatch_decisions(store, fleet, ingest_id)
    if not rows:
        raise HTTPException(404, f"no audited dispatch {ingest_id} in fleet {fleet!r}")
    rows = rows_json(rows)
    first = rows[0]
    stored = next((r["snapshot"] for r in rows if r["snapshot"] is not None), None)
    snapshot = None if stored is None else queries.complete_snapshot(stored, first["prompt_tokens"])
    keys = ("ingest_id", "ts", "request_id", "prompt_tokens", "incumbent_worker",
            "incumbent_policy", "f_br0_incumbent", "f_br0_best", "f_brh_incumbent",
            "f_brh_best", "mirror_jsq_agrees", "router_view_agrees")  # fmt: skip
    return {
        "fleet": fleet,
        **{k: first[k] for k in keys},
        "snapshot": snapshot,
        "choices": [{k: r[k] for k in CHOICE_KEYS} for r in rows],
    }


@router.get("/v1/fleets/{fleet}/violations/timeline")
def violations_timeline(
    fleet: str, store: Store, buckets: Annotated[int, Query(ge=1, le=2000)] = 60
) -> dict[str, Any]:
    """Violations per kind per time bucket, over the span the fleet has violations."""
    span = queries.violation_span(store, fleet)
    if span is None:
        return {"t": [], "bucket_s": None, "kinds": [], "counts": {}}
    t0, t1 = span
    width = max((t1 - t0) / buckets, 1e-3)
    rows = queries.violation_buckets(store, fleet, t0, width, buckets)
    kinds = sorted({r["kind"] for r in rows})
    counts = {k: [0] * buckets for k in kinds}
    for r in rows:
        counts[r["kind"]][int(r["b"])] += int(r["n"])
    return {"t": [t0 + i * width for i in range(buckets)], "bucket_s": width,
            "kinds": kinds, "counts": counts}  # fmt: skip
