"""Read endpoints behind the web UI (docs/UI.md): the comparison table, the compare
view's trajectories, one decision with its snapshot, violation timelines, the audit log,
gate runs (and a dry run on demand) and stored replays.

Every query is fixed SQL with bound parameters; user text never reaches SQL. Sorting
accepts only whitelisted columns.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel

from shadow import __version__
from shadow.analysis.comparison import summary_table
from shadow.modes import auditlog
from shadow.policies import POLICY_NAMES
from shadow.service.runtime import Runtime
from shadow.stream.trajectory import Trajectory, join
from shadow.stream.windows import OBSERVED, WINDOW_METRICS

PAGE_MAX = 1000
CHOICE_KEYS = ("policy", "choice", "agrees", "f_br0_choice", "f_brh_choice", "latency_ms")
#: a compare range decodes at most this many windows (evenly spaced) per policy
COMPARE_MAX_WINDOWS = 240


def clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def rows_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: clean(v) for k, v in row.items()} for row in rows]


def invalid(loc: list[str | int], message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors (the documented schema)."""
    return HTTPException(422, [{"loc": loc, "msg": message, "type": "value_error"}])


def _floats(values: np.ndarray, digits: int = 2) -> list[float | None]:
    return [None if not math.isfinite(v) else round(float(v), digits) for v in values]


class DryRunBody(BaseModel):
    candidate: str
    baseline: str = "jsq"
    since: float | None = None
    until: float | None = None


def _window_range(
    fleet: str, since: float | None, until: float | None, alias: str = ""
) -> tuple[str, dict[str, Any]]:
    """`WHERE` text and parameters for the windows of `fleet` starting in `[since, until)`."""
    where = [f"{alias}fleet = :fleet"]
    params: dict[str, Any] = {"fleet": fleet}
    if since is not None:
        where.append(f"{alias}t_start >= :since")
        params["since"] = since
    if until is not None:
        where.append(f"{alias}t_start < :until")
        params["until"] = until
    return " AND ".join(where), params


def summary(
    runtime: Runtime, fleet: str, incumbent: str, since: float | None, until: float | None,
    indices: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The paper-style table over the windows starting in `[since, until)` (or `indices`)."""
    store = runtime.store
    if indices is not None:
        where = "w.fleet = :fleet AND w.window_index IN (SELECT unnest(:indices))"
        params: dict[str, Any] = {"fleet": fleet, "indices": indices or [-1]}
    else:
        where, params = _window_range(fleet, since, until, alias="w.")
    windows = store.query(
        "SELECT min(t_start) AS t0, max(t_end) AS t1, sum(requests) AS requests, "
        "avg(fidelity_imbalance) AS fi, avg(fidelity_step) AS fs FROM windows w "
        f"WHERE {where}",
        params,
    )[0]
    native = re.sub(r":(\w+)", r"$\1", where)  # DuckDB's own placeholders
    metrics = store.columns(
        f"SELECT m.window_index, m.policy, {', '.join('m.' + m for m in WINDOW_METRICS)} "
        "FROM window_metrics m JOIN windows w ON m.fleet = w.fleet AND "
        f"m.window_index = w.window_index WHERE {native}",
        params,
    )
    table = summary_table(metrics, incumbent)
    return {
        "fleet": fleet,
        "incumbent": incumbent,
        "since": since,
        "until": until,
        "t_start": clean(windows["t0"]),
        "t_end": clean(windows["t1"]),
        "windows": table["windows"],
        "requests": int(windows["requests"] or 0),
        "rows": [{k: clean(v) for k, v in row.items()} for row in table["rows"]],
        "fidelity": {"imbalance": clean(windows["fi"]), "step": clean(windows["fs"])},
    }


def register(
    app: FastAPI,
    runtime: Callable[[], Runtime],
    incumbent_of: Callable[[str], str],
) -> None:
    """Add the UI's read endpoints (and the gate dry run) to `app`."""

    @app.get("/v1/fleets/{fleet}/summary")
    def fleet_summary(
        fleet: str, since: float | None = None, until: float | None = None
    ) -> dict[str, Any]:
        """The paper-style table: each policy's mean window metrics and ratios to the
        incumbent's replay with paired bootstrap 95% CIs over windows."""
        return summary(runtime(), fleet, incumbent_of(fleet), since, until)

    @app.get("/v1/fleets/{fleet}/compare")
    def compare(
        fleet: str,
        window: int | None = None,
        since: float | None = None,
        until: float | None = None,
        policies: str | None = None,
        points: Annotated[int, Query(ge=10, le=20_000)] = 1200,
    ) -> dict[str, Any]:
        """Per-worker load trajectories of the observed run beside the counterfactual
        policies, over one window or the windows starting in a range."""
        store = runtime().store
        incumbent = incumbent_of(fleet)
        if window is not None:
            found = store.query(
                "SELECT window_index, t_start, t_end FROM windows WHERE fleet = :fleet AND "
                "window_index = :w",
                {"fleet": fleet, "w": window},
            )
            if not found:
                raise HTTPException(404, f"window {window} of fleet {fleet!r} is not evaluated")
        elif since is None and until is None:
            found = store.query(
                "SELECT window_index, t_start, t_end FROM windows WHERE fleet = :fleet "
                "ORDER BY window_index DESC LIMIT 1",
                {"fleet": fleet},
            )
        else:
            where, params = _window_range(fleet, since, until)
            found = store.query(
                f"SELECT window_index, t_start, t_end FROM windows WHERE {where} "
                "ORDER BY window_index",
                params,
            )
        found.sort(key=lambda r: r["window_index"])
        in_range = len(found)
        if in_range > COMPARE_MAX_WINDOWS:
            pick = np.linspace(0, in_range - 1, COMPARE_MAX_WINDOWS).round().astype(int)
            found = [found[i] for i in sorted(set(pick.tolist()))]
        indices = [int(r["window_index"]) for r in found]
        starts = {int(r["window_index"]): float(r["t_start"]) for r in found}
        available = sorted(
            {
                r["policy"]
                for r in store.query(
                    "SELECT DISTINCT policy FROM window_trajectories WHERE fleet = :fleet",
                    {"fleet": fleet},
                )
            }
        )
        if policies:
            wanted = [p.strip() for p in policies.split(",") if p.strip()]
            unknown = [p for p in wanted if p not in POLICY_NAMES and p != OBSERVED]
            if unknown:
                raise invalid(["query", "policies"], f"unknown policy {unknown[0]!r}")
        else:
            wanted = [OBSERVED, incumbent, "br0", "brh-survival"]
        wanted = [p for p in dict.fromkeys(wanted) if p in available]
        series: dict[str, Any] = {}
        workers = 0
        if indices and wanted:
            rows = store.query(
                "SELECT * FROM window_trajectories WHERE fleet = :fleet AND window_index IN "
                "(SELECT unnest(:indices)) AND policy IN (SELECT unnest(:policies))",
                {"fleet": fleet, "indices": indices, "policies": wanted},
            )
            parts: dict[str, list[tuple[float, Trajectory]]] = {p: [] for p in wanted}
            for row in rows:
                parts[row["policy"]].append(
                    (starts[int(row["window_index"])], Trajectory.decode(row))
                )
            for policy in wanted:
                path = join(parts[policy], points)
                workers = max(workers, path.workers)
                series[policy] = {
                    "t": _floats(path.t_ms, 3),
                    "loads": [_floats(path.loads[:, g], 1) for g in range(path.workers)],
                    "imbalance": _floats(path.imbalance, 1),
                    "gap": _floats(path.gap, 1),
                    "step_ms": _floats(path.step_ms, 3),
                }
        names = _worker_names(runtime(), fleet, workers)
        return {
            "fleet": fleet,
            "incumbent": incumbent,
            "workers": names,
            "windows": indices,
            "windows_in_range": in_range,
            "sampled": in_range > len(indices),
            "t_start": starts[indices[0]] if indices else None,
            "t_end": float(found[-1]["t_end"]) if found else None,
            "boundaries": [starts[i] for i in indices],
            "policies_available": available,
            "series": series,
            "summary": summary(runtime(), fleet, incumbent, None, None, indices=indices)
            if indices
            else None,
        }

    @app.get("/v1/fleets/{fleet}/decisions/{ingest_id}")
    def decision(fleet: str, ingest_id: int) -> dict[str, Any]:
        """One audited dispatch: the frozen snapshot and every policy's choice on it."""
        rows = runtime().store.query(
            "SELECT * FROM decisions WHERE fleet = :fleet AND ingest_id = :id ORDER BY policy",
            {"fleet": fleet, "id": ingest_id},
        )
        if not rows:
            raise HTTPException(404, f"no audited dispatch {ingest_id} in fleet {fleet!r}")
        rows = rows_json(rows)
        first = rows[0]
        snapshot = json.loads(first["snapshot"])
        loads = snapshot.get("loads", [])
        if "margins" not in snapshot and loads:
            top = max(loads)
            snapshot["margins"] = [top - v for v in loads]
        if "f_br0" not in snapshot and loads:
            p, g = first["prompt_tokens"], len(loads)
            snapshot["f_br0"] = [p - g * max(0.0, p - m) for m in snapshot["margins"]]
        snapshot.setdefault("f_brh", None)
        keys = ("ingest_id", "ts", "request_id", "prompt_tokens", "incumbent_worker",
                "incumbent_policy", "f_br0_incumbent", "f_br0_best", "f_brh_incumbent",
                "f_brh_best", "mirror_jsq_agrees", "router_view_agrees")  # fmt: skip
        return {
            "fleet": fleet,
            **{k: first[k] for k in keys},
            "snapshot": snapshot,
            "choices": [{k: r[k] for k in CHOICE_KEYS} for r in rows],
        }

    @app.get("/v1/fleets/{fleet}/violations/timeline")
    def violations_timeline(
        fleet: str, buckets: Annotated[int, Query(ge=1, le=2000)] = 60
    ) -> dict[str, Any]:
        """Violations per kind per time bucket, over the span the fleet has violations."""
        store = runtime().store
        span = store.query(
            "SELECT min(ts) AS t0, max(ts) AS t1 FROM violations WHERE fleet = :fleet",
            {"fleet": fleet},
        )[0]
        if span["t0"] is None:
            return {"t": [], "bucket_s": None, "kinds": [], "counts": {}}
        t0, t1 = float(span["t0"]), float(span["t1"])
        width = max((t1 - t0) / buckets, 1e-3)
        rows = store.query(
            "SELECT kind, least(CAST(floor((ts - :t0) / :width) AS BIGINT), :last) AS b, "
            "count(*) AS n FROM violations WHERE fleet = :fleet GROUP BY kind, b",
            {"fleet": fleet, "t0": t0, "width": width, "last": buckets - 1},
        )
        kinds = sorted({r["kind"] for r in rows})
        counts = {k: [0] * buckets for k in kinds}
        for r in rows:
            counts[r["kind"]][int(r["b"])] += int(r["n"])
        return {"t": [t0 + i * width for i in range(buckets)], "bucket_s": width,
                "kinds": kinds, "counts": counts}  # fmt: skip

    @app.get("/v1/audit/log")
    def audit_log(
        fleet: str | None = None,
        kind: str | None = None,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
    ) -> dict[str, Any]:
        """Audit-log entries, newest first (mode transitions, operator actions, gate runs)."""
        entries = auditlog.entries(runtime().store.engine, fleet, limit, kind=kind)
        return {
            "items": [
                {
                    k: getattr(e, k)
                    for k in ("seq", "ts", "fleet", "kind", "actor", "reason", "payload")
                }
                for e in entries
            ]
        }

    @app.get("/v1/fleets/{fleet}/gate/runs")
    def gate_runs(
        fleet: str,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """Gate verdicts recorded for the fleet, newest first."""
        store = runtime().store
        params = {"fleet": fleet, "limit": limit, "offset": offset}
        total = store.query("SELECT count(*) AS n FROM gate_runs WHERE fleet = :fleet", params)
        rows = store.query(
            "SELECT id, ts, candidate, baseline, verdict, exit_code, report FROM gate_runs "
            "WHERE fleet = :fleet ORDER BY ts DESC, id DESC LIMIT :limit OFFSET :offset",
            params,
        )
        items = []
        for row in rows:
            report = json.loads(row.pop("report"))
            row["dry_run"] = bool(report.get("dry_run"))
            row["deciding_rule"] = report.get("deciding_rule")
            items.append(row)
        return {"total": int(total[0]["n"]), "limit": limit, "offset": offset,
                "items": rows_json(items)}  # fmt: skip

    @app.get("/v1/gate/runs/{run_id}")
    def gate_run(run_id: int) -> dict[str, Any]:
        rows = runtime().store.query(
            "SELECT id, ts, report FROM gate_runs WHERE id = :id", {"id": run_id}
        )
        if not rows:
            raise HTTPException(404, f"no gate run {run_id}")
        return {**json.loads(rows[0]["report"]), "id": rows[0]["id"], "ts": rows[0]["ts"]}

    @app.post("/v1/fleets/{fleet}/gate/dry-run")
    def gate_dry_run(fleet: str, body: DryRunBody) -> dict[str, Any]:
        """Run the gate on the service's own evidence now; recorded as a dry run (it never
        changes a mode)."""
        from shadow.gate.collect import collect_evidence
        from shadow.gate.record import record_gate_run
        from shadow.gate.verdict import decide

        for name, value in (("candidate", body.candidate), ("baseline", body.baseline)):
            if value not in POLICY_NAMES:
                raise invalid(["body", name], f"{name}: unknown policy {value!r}")
        store = runtime().store
        evidence = collect_evidence(
            store, fleet=fleet, candidate=body.candidate, baseline=body.baseline,
            since=body.since, until=body.until,
        )  # fmt: skip
        report = decide(evidence).as_json(__version__)
        report["dry_run"] = True
        run_id = record_gate_run(store, report, dry_run=True)
        return {**report, "id": run_id, "ts": time.time()}

    @app.get("/v1/replays")
    def replays(
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """Runs stored by `shadow replay`, newest first, with their per-policy summaries."""
        store = runtime().store
        total = store.query("SELECT count(*) AS n FROM replay_runs")[0]["n"]
        runs = store.query(
            "SELECT id, created_at, trace, workers, batch, requests, seed, a_ms_per_token, "
            "b_ms FROM replay_runs ORDER BY id DESC LIMIT :limit OFFSET :offset",
            {"limit": limit, "offset": offset},
        )
        ids = [r["id"] for r in runs]
        summaries = store.query(
            "SELECT * FROM replay_policy_summaries WHERE run_id IN (SELECT unnest(:ids)) "
            "ORDER BY run_id, policy",
            {"ids": ids or [-1]},
        )
        by_run: dict[int, list[dict[str, Any]]] = {}
        for s in rows_json(summaries):
            by_run.setdefault(s["run_id"], []).append(s)
        items = []
        for run in runs:
            run["created_at"] = _iso(run["created_at"])
            run["policies"] = by_run.get(run["id"], [])
            items.append(run)
        return {"total": int(total), "limit": limit, "offset": offset, "items": rows_json(items)}

    @app.get("/v1/replays/{run_id}")
    def replay_run(
        run_id: int, points: Annotated[int, Query(ge=10, le=20_000)] = 600
    ) -> dict[str, Any]:
        """One stored replay: its summaries and per-policy step series, bucketed."""
        store = runtime().store
        runs = store.query("SELECT * FROM replay_runs WHERE id = :id", {"id": run_id})
        if not runs:
            raise HTTPException(404, f"no replay run {run_id}")
        run = runs[0]
        run["created_at"] = _iso(run["created_at"])
        run["config"] = json.loads(run.pop("config_json"))
        summaries = rows_json(
            store.query(
                "SELECT * FROM replay_policy_summaries WHERE run_id = :id ORDER BY policy",
                {"id": run_id},
            )
        )
        steps = store.query(
            "SELECT policy, count(*) AS n FROM replay_steps WHERE run_id = :id GROUP BY policy",
            {"id": run_id},
        )
        series: dict[str, Any] = {}
        for entry in steps:
            buckets = store.query(
                "SELECT CAST(floor(step * :points / :n) AS BIGINT) AS b, avg(start_ms) AS t, "
                "avg(max_load - min_load) AS imbalance, avg(duration_ms) AS step_ms, "
                "avg(active) AS active FROM replay_steps WHERE run_id = :id AND "
                "policy = :policy GROUP BY b ORDER BY b",
                {"id": run_id, "policy": entry["policy"], "points": points, "n": entry["n"]},
            )
            series[entry["policy"]] = {
                "t_ms": [round(float(b["t"]), 3) for b in buckets],
                "imbalance": [round(float(b["imbalance"]), 1) for b in buckets],
                "step_ms": [round(float(b["step_ms"]), 3) for b in buckets],
                "active": [round(float(b["active"]), 2) for b in buckets],
            }
        return {**rows_json([run])[0], "summaries": summaries, "series": series}


def _worker_names(runtime: Runtime, fleet: str, count: int) -> list[str]:
    state = runtime.pipeline.fleets.get(fleet)
    names = [str(w.worker_id) for w in state.mirror.order] if state is not None else []
    if len(names) != count:
        names = [f"w{g}" for g in range(count)]
    return names


def _iso(value: Any) -> Any:
    return value.isoformat() + "Z" if isinstance(value, datetime) else value


SortKey = Literal[
    "ts", "regret", "prompt_tokens", "latency_ms", "request_id", "policy", "incumbent_worker",
    "choice",
]  # fmt: skip
