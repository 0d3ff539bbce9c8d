"""Evaluated windows: the list with per-policy metrics, the paper-style comparison table,
and the compare view's trajectories (observed beside the counterfactual policies)."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, HTTPException, Query

from shadow.analysis.comparison import summary_table
from shadow.policies import POLICY_NAMES
from shadow.service.http.responses import clean, invalid, json_floats, rounded, rows_json
from shadow.service.http.state import AppState, State
from shadow.storage import queries
from shadow.stream.trajectory import Trajectory, join
from shadow.stream.windows import OBSERVED, WINDOW_METRICS

router = APIRouter()

WINDOWS_PAGE_MAX = 5000  # a day of 30 s windows is 2,880
#: a compare range decodes at most this many windows (evenly spaced) per policy
COMPARE_MAX_WINDOWS = 240


def summary(
    state: AppState, fleet: str, since: float | None, until: float | None,
    indices: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The paper-style table over the windows starting in `[since, until)` (or `indices`)."""
    incumbent = state.fleet_state(fleet).incumbent
    windows, metrics = queries.summary_inputs(
        state.runtime.store, fleet, WINDOW_METRICS, since, until, indices
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
        "evidence_windows": table["evidence_windows"],
        "requests": int(windows["requests"] or 0),
        "rows": [{k: clean(v) for k, v in row.items()} for row in table["rows"]],
        "fidelity": {"imbalance": clean(windows["fi"]), "step": clean(windows["fs"])},
    }


def _worker_names(state: AppState, fleet: str, count: int) -> list[str]:
    found = state.runtime.pipeline.fleets.get(fleet)
    names = [str(w.worker_id) for w in found.mirror.order] if found is not None else []
    if len(names) != count:
        names = [f"w{g}" for g in range(count)]
    return names


@router.get("/v1/fleets/{fleet}/windows")
def windows(
    fleet: str,
    state: State,
    policies: bool = True,
    metrics: str | None = None,
    limit: Annotated[int, Query(ge=1, le=WINDOWS_PAGE_MAX)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Evaluated windows with per-policy (and observed) metrics, oldest first
    (`policies=false`: the window rows alone; `metrics=imbalance_mean,...`: only those
    metrics per policy, e.g. one chart over a day of windows)."""
    wanted = list(WINDOW_METRICS)
    if metrics:
        wanted = [m.strip() for m in metrics.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in WINDOW_METRICS]
        if unknown:
            raise invalid(["query", "metrics"], f"unknown metric {unknown[0]!r}; "
                          f"choose from {', '.join(WINDOW_METRICS)}")  # fmt: skip
    store = state.runtime.store
    total, found = queries.windows_page(store, fleet, limit, offset)
    rows = rows_json(found)
    if rows and policies:
        indices = [r["window_index"] for r in rows]
        columns = queries.window_metric_columns(store, fleet, min(indices), max(indices), wanted)
        values = {m: json_floats(columns[m]) for m in wanted}
        by_window: dict[int, dict[str, Any]] = {}
        for i, (index, policy) in enumerate(
            zip(columns["window_index"].tolist(), columns["policy"].tolist(), strict=True)
        ):
            by_window.setdefault(index, {})[policy] = {m: values[m][i] for m in wanted}
        for row in rows:
            row["policies"] = by_window.get(row["window_index"], {})
    return {"total": total, "limit": limit, "offset": offset, "items": rows}


@router.get("/v1/fleets/{fleet}/summary")
def fleet_summary(
    fleet: str, state: State, since: float | None = None, until: float | None = None
) -> dict[str, Any]:
    """The paper-style table: each policy's mean window metrics, and its ratios to the
    incumbent's replay as the gate estimates them (95% CIs over windows)."""
    return summary(state, fleet, since, until)


@router.get("/v1/fleets/{fleet}/compare")
def compare(
    fleet: str,
    state: State,
    window: int | None = None,
    since: float | None = None,
    until: float | None = None,
    policies: str | None = None,
    points: Annotated[int, Query(ge=10, le=20_000)] = 1200,
) -> dict[str, Any]:
    """Per-worker load trajectories of the observed run beside the counterfactual
    policies, over one window or the windows starting in a range."""
    store = state.runtime.store
    incumbent = state.fleet_state(fleet).incumbent
    found = queries.window_bounds(store, fleet, window, since, until)
    if window is not None and not found:
        raise HTTPException(404, f"window {window} of fleet {fleet!r} is not evaluated")
    found.sort(key=lambda r: r["window_index"])
    in_range = len(found)
    if in_range > COMPARE_MAX_WINDOWS:
        pick = np.linspace(0, in_range - 1, COMPARE_MAX_WINDOWS).round().astype(int)
        found = [found[i] for i in sorted(set(pick.tolist()))]
    indices = [int(r["window_index"]) for r in found]
    starts = {int(r["window_index"]): float(r["t_start"]) for r in found}
    available = queries.trajectory_policies(store, fleet)
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
        parts: dict[str, list[tuple[float, Trajectory]]] = {p: [] for p in wanted}
        for row in queries.trajectories(store, fleet, indices, wanted):
            parts[row["policy"]].append((starts[int(row["window_index"])], Trajectory.decode(row)))
        for policy in wanted:
            path = join(parts[policy], points)
            workers = max(workers, path.workers)
            series[policy] = {
                "t": rounded(path.t_ms, 3),
                "loads": [rounded(path.loads[:, g], 1) for g in range(path.workers)],
                "imbalance": rounded(path.imbalance, 1),
                "gap": rounded(path.gap, 1),
                "step_ms": rounded(path.step_ms, 3),
            }
    return {
        "fleet": fleet,
        "incumbent": incumbent,
        "workers": _worker_names(state, fleet, workers),
        "windows": indices,
        "windows_in_range": in_range,
        "sampled": in_range > len(indices),
        "t_start": starts[indices[0]] if indices else None,
        "t_end": float(found[-1]["t_end"]) if found else None,
        "boundaries": [starts[i] for i in indices],
        "policies_available": available,
        "series": series,
        "summary": summary(state, fleet, None, None, indices=indices) if indices else None,
    }
