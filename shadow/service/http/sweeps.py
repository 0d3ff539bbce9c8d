"""Read endpoints over stored sweeps (`shadow sweep`): the list, and the heatmap of one
metric over two parameters that the UI draws.

Fixed SQL with bound parameters; parameter and metric names are checked against the
whitelists (`shadow.sweep.grid.PARAMS`, the stored metrics) before they are used.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from shadow.service.http.state import Store
from shadow.storage import METRICS
from shadow.sweep.grid import PARAMS, GridError, canonical_name
from shadow.sweep.results import heatmap
from shadow.sweep.store import Query, list_sweeps, sweep_rows

#: Query parameters of the heatmap that are not filters.
_HEATMAP_ARGS = frozenset({"x", "y", "metric"})


def _param(name: str, what: str) -> str:
    try:
        resolved = canonical_name(name)
    except GridError as error:
        raise HTTPException(400, f"{what}: {error}") from None
    if resolved not in PARAMS:
        raise HTTPException(
            400, f"{what}: {resolved} selects the trace and is not a cell parameter"
        )
    return resolved


def heatmap_answer(
    store: Query, sweep: str, x: str, y: str, metric: str, filters: dict[str, str]
) -> dict[str, Any]:
    """The heatmap of `GET /v1/sweeps/{sweep}/heatmap`, from a store with `.query`."""
    x_name, y_name = _param(x, "x"), _param(y, "y")
    if x_name == y_name:
        raise HTTPException(400, f"x and y are both {x_name}; choose two parameters")
    if metric not in METRICS:
        raise HTTPException(400, f"metric: unknown {metric!r}; choose from {', '.join(METRICS)}")
    values: dict[str, Any] = {}
    for raw, text in filters.items():
        name = _param(raw, raw)
        try:
            values[name] = PARAMS[name].parse(text)
        except GridError as error:
            raise HTTPException(400, str(error)) from None
    if not store.query("SELECT 1 AS found FROM sweeps WHERE name = :name", {"name": sweep}):
        raise HTTPException(404, f"no sweep {sweep!r}")
    return heatmap(sweep_rows(store, sweep), x_name, y_name, metric, values)


router = APIRouter()


@router.get("/v1/sweeps")
def sweeps(store: Store) -> dict[str, Any]:
    """Stored sweeps, newest first: trace, cells, the parameters they vary and the
    values each takes."""
    return {"items": list_sweeps(store)}


@router.get("/v1/sweeps/{sweep}/heatmap")
def sweep_heatmap(
    sweep: str,
    request: Request,
    store: Store,
    x: str = "beta",
    y: str = "gamma",
    metric: str = "throughput_tok_s",
) -> dict[str, Any]:
    """`metric` over `x` by `y`: `z[j][i]` at (`x.values[i]`, `y.values[j]`), the mean
    over seeds and over every parameter not on an axis unless a query parameter fixes
    it (`policy=brh-oracle`, `horizon=80`, ...); null where no cell lies."""
    filters = {k: v for k, v in request.query_params.items() if k not in _HEATMAP_ARGS}
    return heatmap_answer(store, sweep, x, y, metric, filters)
