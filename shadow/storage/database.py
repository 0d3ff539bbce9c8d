"""Open, migrate and use the DuckDB results database.

Few-row tables (runs, summaries) go through SQLAlchemy; the bulk per-step series go
through DuckDB's Arrow interface on the *same* DuckDB connection and transaction, because
per-row ORM inserts of millions of telemetry rows take minutes instead of a second.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, cast

import duckdb
import numpy as np
import pyarrow as pa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, Engine, create_engine, event, insert, select

import shadow

from .models import COUNT_METRICS, METRICS, STEP_SERIES, ReplayPolicySummary, ReplayRun

_RUN_REQUIRED = ("trace", "workers", "batch", "requests", "a_ms_per_token", "b_ms")
_RUN_OPTIONAL = ("seed", "config_json", "config", "tool_version", "created_at")
_STEP_TYPES: dict[str, pa.DataType] = {
    "start_ms": pa.float64(),
    "duration_ms": pa.float64(),
    "max_load": pa.int64(),
    "min_load": pa.int64(),
    "sum_load": pa.int64(),
    "active": pa.int32(),
}
_STEP_NUMPY: dict[str, np.dtype[Any]] = {
    "start_ms": np.dtype(np.float64),
    "duration_ms": np.dtype(np.float64),
    "max_load": np.dtype(np.int64),
    "min_load": np.dtype(np.int64),
    "sum_load": np.dtype(np.int64),
    "active": np.dtype(np.int32),
}
# Registered Arrow views are per-connection; a counter keeps concurrent saves apart.
_view_counter = itertools.count()
_view_lock = threading.Lock()


def migrations_dir() -> Path:
    """The repo's top-level ``migrations/`` (Alembic script directory)."""
    return Path(shadow.__file__).resolve().parents[1] / "migrations"


def _alembic_config(url: str) -> Config:
    """Programmatic Alembic config: no ini file needed at runtime."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("path_separator", "os")
    # ConfigParser interpolates '%'; a path containing one must be escaped.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The newest revision among the migration scripts."""
    head = ScriptDirectory.from_config(_alembic_config("duckdb://")).get_current_head()
    if head is None:  # pragma: no cover - the repo always ships 0001
        raise RuntimeError(f"no Alembic revisions in {migrations_dir()}")
    return head


def _without_progress_bar(dbapi_connection: Any, _record: Any) -> None:
    """DuckDB draws a progress bar on stdout for any query past 2 s, on every connection
    (the setting is per connection): in a service's log or a CI log it is noise between
    the lines people read."""
    dbapi_connection.execute("SET enable_progress_bar = false")


def open_database(path: str | Path) -> Database:
    """Open (creating if needed) the DuckDB file at ``path`` and upgrade it to head.

    Every command that opens a database upgrades it first, so code never meets an old
    schema; at head the upgrade is a no-op.
    """
    resolved = Path(path).expanduser().resolve()
    resolved.parent.mkdir(parents=True, exist_ok=True)
    # URL.create, not an f-string: a URL string would percent-decode '%41' or '#' in paths.
    url = URL.create("duckdb", database=str(resolved))
    engine = create_engine(url)
    event.listen(engine, "connect", _without_progress_bar)
    try:
        cfg = _alembic_config(url.render_as_string(hide_password=False))
        # Share one connection (and thus one DuckDB instance / file lock) with Alembic;
        # the whole upgrade commits or rolls back as one transaction.
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    except BaseException:
        engine.dispose()
        raise
    return Database(engine, resolved)


def upgrade(path: str | Path) -> str:
    """Upgrade the database at ``path`` to head (``shadow db upgrade``); return the head."""
    with open_database(path) as db:
        revision = db.revision()
    if revision is None:  # pragma: no cover - upgrade always stamps a revision
        raise RuntimeError(f"{path}: no Alembic revision after upgrade")
    return revision


def duck_connection(conn: Connection) -> duckdb.DuckDBPyConnection:
    """The DuckDB connection under a SQLAlchemy connection (same transaction).

    duckdb_engine's ConnectionWrapper forwards unknown attributes (``execute``,
    ``register``, ...) to the wrapped ``DuckDBPyConnection``.
    """
    return cast(duckdb.DuckDBPyConnection, conn.connection.driver_connection)


def _column(values: Any, dtype: pa.DataType, what: str) -> pa.Array:
    """A 1-D numpy-like as an Arrow array of ``dtype``; lossy casts raise, not truncate."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D array, got shape {arr.shape}")
    try:
        return pa.array(arr).cast(dtype, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"{what}: cannot store as {dtype}: {exc}") from exc


def _steps_table(policy: str, series: Mapping[str, Any]) -> pa.Table:
    keys = set(series)
    if keys != set(STEP_SERIES):
        raise ValueError(
            f"steps[{policy!r}]: expected keys {sorted(STEP_SERIES)}, "
            f"missing {sorted(set(STEP_SERIES) - keys)}, unknown {sorted(keys - set(STEP_SERIES))}"
        )
    cols = {k: _column(series[k], _STEP_TYPES[k], f"steps[{policy!r}][{k!r}]") for k in STEP_SERIES}
    lengths = {k: len(v) for k, v in cols.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"steps[{policy!r}]: series lengths differ: {lengths}")
    n = next(iter(lengths.values()))
    return pa.table({"step": pa.array(np.arange(n, dtype=np.int32)), **cols})


def _workers_table(policy: str, loads: Any, active: Any) -> pa.Table:
    la, aa = np.asarray(loads), np.asarray(active)
    if la.ndim != 2 or la.shape != aa.shape:
        raise ValueError(
            f"worker_loads/worker_active[{policy!r}]: expected equal 2-D [steps, workers] "
            f"arrays, got {la.shape} and {aa.shape}"
        )
    n_steps, n_workers = la.shape
    return pa.table(
        {
            "step": pa.array(np.repeat(np.arange(n_steps, dtype=np.int32), n_workers)),
            "worker": pa.array(np.tile(np.arange(n_workers, dtype=np.int32), n_steps)),
            "load": _column(la.reshape(-1), pa.int64(), f"worker_loads[{policy!r}]"),
            "active": _column(aa.reshape(-1), pa.int32(), f"worker_active[{policy!r}]"),
        }
    )


def _run_row(run: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(run) - set(_RUN_REQUIRED) - set(_RUN_OPTIONAL)
    missing = set(_RUN_REQUIRED) - set(run)
    if unknown or missing:
        raise ValueError(f"run: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    if ("config_json" in run) == ("config" in run):
        raise ValueError("run: give exactly one of 'config_json' (str) or 'config' (mapping)")
    config_json = run.get("config_json")
    if config_json is None:
        config_json = json.dumps(run["config"], sort_keys=True, default=str)
    created_at = run.get("created_at") or datetime.now(UTC)
    if created_at.tzinfo is not None:  # stored as naive UTC
        created_at = created_at.astimezone(UTC).replace(tzinfo=None)
    seed = run.get("seed")
    return {
        "created_at": created_at,
        "trace": str(run["trace"]),
        "workers": int(run["workers"]),
        "batch": int(run["batch"]),
        "requests": int(run["requests"]),
        "a_ms_per_token": float(run["a_ms_per_token"]),
        "b_ms": float(run["b_ms"]),
        "seed": None if seed is None else int(seed),
        "config_json": str(config_json),
        "tool_version": str(run.get("tool_version") or shadow.__version__),
    }


def _summary_row(policy: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(
            f"summaries[{policy!r}]: unknown metrics {sorted(unknown)} (add a migration first)"
        )
    # Every row carries every metric: an executemany takes its columns from the first row
    # and would silently drop metrics that only later rows have.
    row: dict[str, Any] = {"policy": policy, **dict.fromkeys(METRICS)}
    for name, value in metrics.items():
        if value is None:
            continue
        if name in COUNT_METRICS:
            as_float = float(value)
            if not as_float.is_integer():
                raise ValueError(f"summaries[{policy!r}][{name!r}] must be integral: {value}")
            row[name] = int(as_float)
        else:
            row[name] = float(value)
    return row


def _insert_arrow(
    duck: duckdb.DuckDBPyConnection, table: str, data: pa.Table, run_id: int, policy: str
) -> None:
    """Append ``data`` to ``table`` via a registered Arrow view (zero-copy scan)."""
    with _view_lock:
        view = f"_shadow_arrow_{next(_view_counter)}"
    columns = ", ".join(data.column_names)
    duck.register(view, data)
    try:
        duck.execute(
            f"INSERT INTO {table} (run_id, policy, {columns}) SELECT ?, ?, {columns} FROM {view}",
            [run_id, policy],
        )
    finally:
        duck.unregister(view)


class Database:
    """A migrated results database; use :func:`open_database` to get one."""

    def __init__(self, engine: Engine, path: Path) -> None:
        self.engine = engine
        self.path = path

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close pooled connections, releasing DuckDB's file lock."""
        self.engine.dispose()

    def revision(self) -> str | None:
        """The Alembic revision the database is at."""
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def save_replay(
        self,
        run: Mapping[str, Any],
        summaries: Mapping[str, Mapping[str, float]],
        steps: Mapping[str, Mapping[str, np.ndarray]],
        worker_loads: Mapping[str, np.ndarray] | None = None,
        worker_active: Mapping[str, np.ndarray] | None = None,
    ) -> int:
        """Store one replay atomically and return its run id.

        ``run`` holds the ``replay_runs`` columns (``trace``, ``workers``, ``batch``,
        ``requests``, ``a_ms_per_token``, ``b_ms``, optional ``seed``, ``created_at``,
        ``tool_version``, and ``config_json`` or a ``config`` mapping). ``steps[policy]``
        maps each of :data:`STEP_SERIES` to a 1-D array (step = position);
        ``worker_loads[policy]`` / ``worker_active[policy]`` are [steps, workers] arrays
        and must be given for the same policies. Any failure rolls the whole run back.
        """
        loads = dict(worker_loads or {})
        actives = dict(worker_active or {})
        if set(loads) != set(actives):
            raise ValueError(
                "worker_loads and worker_active must cover the same policies: "
                f"{sorted(loads)} vs {sorted(actives)}"
            )
        run_row = _run_row(run)
        summary_rows = [_summary_row(p, m) for p, m in summaries.items()]
        with self.engine.begin() as conn:
            run_id = conn.execute(
                insert(ReplayRun).values(**run_row).returning(ReplayRun.id)
            ).scalar_one()
            if summary_rows:
                conn.execute(
                    insert(ReplayPolicySummary), [{"run_id": run_id, **r} for r in summary_rows]
                )
            duck = duck_connection(conn)
            # Arrow tables are built per policy inside the transaction: a bad array
            # raises here and the rollback removes everything written so far.
            for policy, series in steps.items():
                _insert_arrow(duck, "replay_steps", _steps_table(policy, series), run_id, policy)
            for policy, arr in loads.items():
                data = _workers_table(policy, arr, actives[policy])
                _insert_arrow(duck, "replay_worker_loads", data, run_id, policy)
        return int(run_id)

    def list_runs(self) -> list[dict[str, Any]]:
        """All runs, oldest first, as plain dicts of their columns."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(ReplayRun.__table__).order_by(ReplayRun.id)).mappings()
            return [dict(r) for r in rows]

    def run_summaries(self, run_id: int) -> dict[str, dict[str, float]]:
        """``{policy: {metric: value}}`` for one run; metrics stored as NULL are omitted."""
        table = ReplayPolicySummary.__table__
        stmt = select(table).where(table.c.run_id == run_id).order_by(table.c.policy)
        with self.engine.connect() as conn:
            out: dict[str, dict[str, float]] = {}
            for row in conn.execute(stmt).mappings():
                out[row["policy"]] = {m: row[m] for m in METRICS if row[m] is not None}
            return out

    def _run_exists(self, conn: Connection, run_id: int) -> bool:
        stmt = select(ReplayRun.id).where(ReplayRun.id == run_id)
        return conn.execute(stmt).first() is not None

    def step_series(self, run_id: int, policy: str) -> dict[str, np.ndarray]:
        """The per-step series of one policy, keyed like ``save_replay``'s ``steps``."""
        with self.engine.connect() as conn:
            got = (
                duck_connection(conn)
                .execute(
                    f"SELECT {', '.join(STEP_SERIES)} FROM replay_steps "
                    "WHERE run_id = ? AND policy = ? ORDER BY step",
                    [run_id, policy],
                )
                .fetchnumpy()
            )
            if len(got[STEP_SERIES[0]]) == 0 and not self._run_exists(conn, run_id):
                raise KeyError(f"no replay run {run_id}")
        return {k: np.asarray(got[k], dtype=_STEP_NUMPY[k]) for k in STEP_SERIES}

    def worker_series(self, run_id: int, policy: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``(loads, active)`` as [steps, workers] arrays, or None if none were saved."""
        with self.engine.connect() as conn:
            got = (
                duck_connection(conn)
                .execute(
                    "SELECT step, worker, load, active FROM replay_worker_loads "
                    "WHERE run_id = ? AND policy = ? ORDER BY step, worker",
                    [run_id, policy],
                )
                .fetchnumpy()
            )
        if len(got["step"]) == 0:
            return None
        n_steps, n_workers = int(got["step"][-1]) + 1, int(got["worker"].max()) + 1
        if n_steps * n_workers != len(got["step"]):
            raise RuntimeError(f"replay_worker_loads for run {run_id}/{policy!r} is not a grid")
        shape = (n_steps, n_workers)
        return (
            np.asarray(got["load"], dtype=np.int64).reshape(shape),
            np.asarray(got["active"], dtype=np.int32).reshape(shape),
        )
