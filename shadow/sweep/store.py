"""Sweeps in the results database, and their Parquet export.

Each cell is an ordinary replay run: a `replay_runs` row whose `config_json` carries the
sweep, the cell's parameters and its `cell_key`, plus its `replay_policy_summaries` row
(and, with `--steps`, its per-step rows). `sweeps` names a sweep; `sweep_cells` says which
runs are its cells. A cell is found by its key in `replay_runs` itself, so a run stored
just before a crash (and not yet linked) is still found and linked, never replayed twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import BigInteger, DateTime, Engine, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from shadow.storage import METRICS, Base, Database
from shadow.storage.models import COUNT_METRICS
from shadow.sweep.cell import TIMING_METRICS
from shadow.sweep.grid import PARAMS


class Sweep(Base):
    """A named sweep: the trace it replays and the grid of its latest invocation."""

    __tablename__ = "sweeps"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    trace: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)  # naive UTC
    updated_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    spec_json: Mapped[str] = mapped_column(Text, nullable=False)


class SweepCell(Base):
    """Membership: run `run_id` is the cell `cell_key` of sweep `sweep`."""

    __tablename__ = "sweep_cells"

    sweep: Mapped[str] = mapped_column(Text, primary_key=True)
    cell_key: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Query(Protocol):
    """Anything that runs bound SQL and returns rows as dicts (`ServiceStore`, ...)."""

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...


class EngineQuery:
    """`Query` over a SQLAlchemy engine (the CLI's `Database`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text(sql), params or {})]


class SweepConflict(ValueError):
    """A sweep name already used for another trace."""


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def ensure_sweep(database: Database, name: str, trace: str, spec: Mapping[str, Any]) -> None:
    """Create sweep `name`, or record this invocation's grid on it (same trace only)."""
    spec_json = json.dumps(spec, sort_keys=True)
    with database.engine.begin() as conn:
        found = conn.execute(
            text("SELECT trace FROM sweeps WHERE name = :name"), {"name": name}
        ).first()
        if found is None:
            conn.execute(
                text(
                    "INSERT INTO sweeps (name, trace, created_at, updated_at, spec_json) "
                    "VALUES (:name, :trace, :now, :now, :spec)"
                ),
                {"name": name, "trace": trace, "now": _now(), "spec": spec_json},
            )
        elif found[0] != trace:
            raise SweepConflict(
                f"sweep {name!r} replays {found[0]!r}, not {trace!r}; choose another --name"
            )
        else:
            conn.execute(
                text("UPDATE sweeps SET updated_at = :now, spec_json = :spec WHERE name = :name"),
                {"name": name, "now": _now(), "spec": spec_json},
            )


_KEY_SQL = (
    "CASE WHEN json_valid(config_json) THEN json_extract_string(config_json, '$.cell_key') END"
)


def stored_cells(database: Database, keys: Iterable[str]) -> dict[str, int]:
    """`{cell_key: run_id}` for the cells already stored (the oldest run of each key)."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    rows = EngineQuery(database.engine).query(
        f"SELECT key, min(id) AS run_id FROM (SELECT id, {_KEY_SQL} AS key FROM replay_runs) "
        "WHERE key IN (SELECT unnest(:keys)) GROUP BY key",
        {"keys": wanted},
    )
    return {row["key"]: int(row["run_id"]) for row in rows}


def link(database: Database, sweep: str, cells: Mapping[str, int]) -> None:
    """Make the runs `cells` ({cell_key: run_id}) cells of `sweep` (idempotent)."""
    if not cells:
        return
    with database.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sweep_cells (sweep, cell_key, run_id) VALUES (:sweep, :key, :run) "
                "ON CONFLICT DO NOTHING"
            ),
            [{"sweep": sweep, "key": key, "run": run} for key, run in cells.items()],
        )


def save_cell(
    database: Database,
    *,
    sweep: str,
    key: str,
    params: Mapping[str, Any],
    source: str,
    trace_digest: str,
    trace_options: Mapping[str, Any],
    result: Mapping[str, Any],
) -> int:
    """Store one finished cell as a replay run and link it to `sweep`; its run id."""
    from shadow import __version__

    policy = str(params["policy"])
    steps = {policy: result["steps"]} if "steps" in result else {}
    loads = {policy: result["worker_load"]} if "worker_load" in result else None
    active = {policy: result["worker_active"]} if "worker_active" in result else None
    run_id = database.save_replay(
        {
            "trace": source,
            "workers": int(params["workers"]),
            "batch": int(params["batch"]),
            "requests": int(result["requests"]),
            "a_ms_per_token": float(params["step_a"]),
            "b_ms": float(params["step_b"]),
            "seed": int(params["seed"]),
            "config": {
                "sweep": sweep,
                "cell_key": key,
                "params": dict(params),
                "trace_digest": trace_digest,
                # The keys `shadow replay` writes, so stored-replay views read cells too.
                "policies": [policy],
                "load": params.get("load"),
                "rate_scale": None,
                **dict(trace_options),
            },
            "tool_version": __version__,
        },
        {policy: result["metrics"]},
        steps,
        loads,
        active,
    )
    link(database, sweep, {key: run_id})
    return run_id


def sweep_rows(store: Query, sweep: str) -> list[dict[str, Any]]:
    """Every cell of `sweep`: `{cell_key, run_id, trace, requests, params, metrics}`,
    ordered by run id."""
    rows = store.query(
        "SELECT c.cell_key, r.id AS run_id, r.trace, r.requests, r.config_json, s.* "
        "FROM sweep_cells c JOIN replay_runs r ON r.id = c.run_id "
        "JOIN replay_policy_summaries s ON s.run_id = r.id "
        "WHERE c.sweep = :sweep ORDER BY r.id",
        {"sweep": sweep},
    )
    out = []
    for row in rows:
        config = json.loads(row["config_json"])
        metrics = {}
        for name in METRICS:
            value = row.get(name)
            metrics[name] = None if value is None or _nan(value) else value
        out.append(
            {
                "cell_key": row["cell_key"],
                "run_id": int(row["run_id"]),
                "trace": row["trace"],
                "requests": int(row["requests"]),
                "params": {name: config["params"].get(name) for name in PARAMS},
                "metrics": metrics,
            }
        )
    return out


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def list_sweeps(store: Query) -> list[dict[str, Any]]:
    """Every sweep with its trace, cell count, and the values of each varied parameter."""
    sweeps = store.query(
        "SELECT name, trace, created_at, updated_at FROM sweeps ORDER BY updated_at DESC, name"
    )
    configs = store.query(
        "SELECT c.sweep, r.config_json FROM sweep_cells c JOIN replay_runs r ON r.id = c.run_id"
    )
    params: dict[str, list[dict[str, Any]]] = {}
    for row in configs:
        params.setdefault(row["sweep"], []).append(json.loads(row["config_json"])["params"])
    items = []
    for sweep in sweeps:
        cells = params.get(sweep["name"], [])
        values: dict[str, list[Any]] = {}
        for name in PARAMS:
            seen = sorted({c.get(name) for c in cells if c.get(name) is not None}, key=_order)
            if len(seen) > 1 or (name in ("policy", "seed") and seen):
                values[name] = seen
        items.append(
            {
                "name": sweep["name"],
                "trace": sweep["trace"],
                "created_at": _iso(sweep["created_at"]),
                "updated_at": _iso(sweep["updated_at"]),
                "cells": len(cells),
                "varied": [n for n in values if n not in ("policy", "seed") or len(values[n]) > 1],
                "values": values,
            }
        )
    return items


def _iso(value: Any) -> str | None:
    return None if value is None else value.replace(tzinfo=UTC).isoformat()


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))


#: Parquet columns of a parameter: its Arrow type.
_PARAM_TYPES = {
    name: pa.string() if p.kind is str else pa.int64() if p.kind is int else pa.float64()
    for name, p in PARAMS.items()
}
#: Exported metrics: the simulated ones (wall-time metrics stay in the database).
EXPORT_METRICS = tuple(m for m in METRICS if m not in TIMING_METRICS)


def parquet_table(sweep: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """One row per cell: identity, every parameter (null where the policy ignores it) and
    every simulated metric."""
    ordered = sorted(rows, key=lambda r: [_order(r["params"].get(n)) for n in PARAMS])
    columns: dict[str, pa.Array] = {
        "sweep": pa.array([sweep] * len(ordered), pa.string()),
        "cell_key": pa.array([r["cell_key"] for r in ordered], pa.string()),
        "run_id": pa.array([r["run_id"] for r in ordered], pa.int64()),
        "trace": pa.array([r["trace"] for r in ordered], pa.string()),
        "requests": pa.array([r["requests"] for r in ordered], pa.int64()),
    }
    for name, kind in _PARAM_TYPES.items():
        columns[name] = pa.array([r["params"].get(name) for r in ordered], kind)
    for metric in EXPORT_METRICS:
        kind = pa.int64() if metric in COUNT_METRICS else pa.float64()
        columns[metric] = pa.array([r["metrics"].get(metric) for r in ordered], kind)
    return pa.table(columns)


def write_parquet(sweep: str, rows: Sequence[Mapping[str, Any]], path: Path) -> int:
    """Write the cells to `path`; the number of rows written."""
    table = parquet_table(sweep, rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return table.num_rows
