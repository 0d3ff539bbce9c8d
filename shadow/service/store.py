"""Durable storage of the shadow service in DuckDB.

Everything acknowledged is written before the acknowledgement, in one transaction (per
batch, or per group of batches: `shadow.service.ingest.committer`): lifecycle events, engine
steps and cumulative progress are appended through DuckDB's Arrow interface, progress to
a log folded into one row per request every few seconds. Derived rows (decisions,
violations) carry the `ingest_id` of the event that produced them and are written in one
transaction with the checkpoint `applied_through`, so a restart re-derives exactly the
tail after it.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from shadow.events import EVENT_ORDER
from shadow.storage import open_database
from shadow.storage.archive import ARCHIVED_SEQ
from shadow.storage.database import duck_connection
from shadow.stream.audit import Decision
from shadow.stream.invariants import Violation
from shadow.stream.trajectory import FIELDS as TRAJECTORY_FIELDS
from shadow.stream.window_metrics import encode_tpot
from shadow.stream.windows import WINDOW_METRICS, WindowResult

LIFECYCLE_COLUMNS = (
    "ingest_id", "fleet", "source", "seq", "type", "ts", "request_id", "worker",
    "prompt_tokens", "prompt_hash", "max_tokens", "policy", "router_view", "output_tokens",
    "reason", "capacity", "state", "raw_reason", "estimated", "from_engine",
)  # fmt: skip
STEP_COLUMNS = (
    "ingest_id", "fleet", "source", "seq", "worker", "step", "ts", "duration_ms", "running",
    "kv_tokens", "waiting", "tokens",
)  # fmt: skip
#: A finish that met an earlier finish of its request (`shadow.stream.join`): the earlier
#: one's count may be corrected (`output_tokens`, NULL: kept) and the later one points at
#: it (`joined_to`, NULL: kept; `UNJOIN`: cleared, for the one that finished the request:
#: a restart that applies stored events in another order than the live path did (a
#: straggler) rewrites both), so readers count one finish per request.
UNJOIN = -1
_FINISH_UPDATES = pa.schema(
    [("ingest_id", pa.int64()), ("output_tokens", pa.int64()), ("joined_to", pa.int64())]
)
_UPDATE_FINISHES = (
    "UPDATE events SET output_tokens = coalesce(r.output_tokens, events.output_tokens), "
    "joined_to = CASE WHEN r.joined_to = -1 THEN NULL "
    "ELSE coalesce(r.joined_to, events.joined_to) END FROM rows_finish_updates r "
    "WHERE events.ingest_id = r.ingest_id"
)
PROGRESS_COLUMNS = ("fleet", "request_id", "generated", "ts", "ingest_id")
STATE_COLUMNS = ("name", "value")
SAMPLE_COLUMNS = ("fleet", "worker", "ts", "running", "waiting", "kv_usage",
                  "generation_tokens", "mirror_active")  # fmt: skip
#: `ingest_id` then the fields of `shadow.stream.audit.Decision`, in order.
DECISION_COLUMNS = (
    "ingest_id", "fleet", "ts", "request_id", "prompt_tokens", "incumbent_worker",
    "incumbent_policy", "policy", "choice", "agrees", "f_br0_incumbent", "f_br0_choice",
    "f_br0_best", "f_brh_incumbent", "f_brh_choice", "f_brh_best", "mirror_jsq_agrees",
    "router_view_agrees", "latency_ms", "snapshot_z",
)  # fmt: skip
VIOLATION_COLUMNS = ("ingest_id", "fleet", "kind", "severity", "worker", "request_id", "ts",
                     "detail")  # fmt: skip

TRAJECTORY_COLUMNS = ("fleet", "window_index", "policy", "points", "workers", *TRAJECTORY_FIELDS)
WINDOW_COLUMNS = ("fleet", "window_index", "t_start", "t_end", "requests", "imputed",
                  "a_ms_per_token", "b_ms", "step_model_fitted", "fidelity_imbalance",
                  "fidelity_step", "run_start", "run_start_held")  # fmt: skip
FIT_COLUMNS = ("fleet", "fitted_at", "a_ms_per_token", "b_ms", "r2", "n", "t_start", "t_end",
               "fallback", "reason")  # fmt: skip
#: Tables keyed by a primary key, where a row may be written again (restart, newer value).
UPSERT_TABLES = frozenset({"windows", "window_metrics", "window_trajectories", "ingest_state"})
#: Every request's latest progress: `progress_latest` and the log not yet folded into it
#: (`ServiceStore.compact_progress`), as a subquery.
LATEST_PROGRESS = (
    "(SELECT * FROM (SELECT fleet, request_id, generated, ts, ingest_id FROM progress_latest "
    "UNION ALL SELECT fleet, request_id, generated, ts, ingest_id FROM progress_log) "
    "QUALIFY row_number() OVER (PARTITION BY fleet, request_id ORDER BY generated DESC) = 1)"
)
_FOLD_PROGRESS = (
    "INSERT INTO progress_latest SELECT fleet, request_id, max(generated), "
    "arg_max(ts, generated), arg_max(ingest_id, generated) FROM progress_log "
    "GROUP BY fleet, request_id ON CONFLICT (fleet, request_id) DO UPDATE SET "
    "generated = excluded.generated, ts = excluded.ts, ingest_id = excluded.ingest_id "
    "WHERE excluded.generated > progress_latest.generated"
)
#: Violations raised by events that are not stored: a lower progress than the request's
#: highest (only the highest is kept), so a restart cannot derive them again.
NOT_REDERIVED = ("progress_decreased",)
#: the incident of new violation row `r` (what the checker reports once) is stored
_INCIDENT_STORED = (
    "EXISTS (SELECT 1 FROM violations v WHERE v.fleet = r.fleet AND v.kind = r.kind "
    "AND v.worker IS NOT DISTINCT FROM r.worker "
    "AND v.request_id IS NOT DISTINCT FROM r.request_id)"
)
#: (table, columns) -> Arrow schema; the tables' types are fixed by the migrations
_schemas: dict[tuple[str, tuple[str, ...]], pa.Schema] = {}


class StorageError(RuntimeError):
    """A write to the database failed for want of storage (a full disk, an I/O error);
    the transaction, and everything it was to store, is not in the database."""

    def __init__(self, path: Path, cause: BaseException) -> None:
        reason = " ".join(str(cause).split())
        self.disk_full = "no space left" in reason.lower()
        what = f"the disk holding {path} is full" if self.disk_full else f"cannot write {path}"
        super().__init__(f"storage failed: {what}; the batch was not stored ({reason})")

    @staticmethod
    def caused(error: BaseException) -> BaseException | None:
        """The storage failure behind `error` (DuckDB's, bare or wrapped by SQLAlchemy);
        None when `error` is something else."""
        cause = error.orig if isinstance(error, DBAPIError) else error
        text_ = str(cause).lower()
        storage = isinstance(cause, (duckdb.IOException, duckdb.FatalException, OSError))
        if storage or "could not write" in text_ or "no space left" in text_:
            return cause
        return None


@dataclass
class EventBatch:
    """Rows of one acknowledged batch, column-wise."""

    lifecycle: list[tuple] = field(default_factory=list)
    steps: list[tuple] = field(default_factory=list)
    samples: list[tuple] = field(default_factory=list)
    progress: dict[tuple[str, str], tuple] = field(default_factory=dict)
    #: (fleet, source) -> the highest seq received from it, progress included (the seqs
    #: of progress events are not stored otherwise; see `seq_highs`)
    seq_high: dict[tuple[str, str], int] = field(default_factory=dict)
    #: stored finish rows the join changed: ingest id -> (output_tokens, joined_to), each
    #: None for "kept" (`_FINISH_UPDATES`)
    finish_updates: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)

    def __len__(self) -> int:
        return (
            len(self.lifecycle) + len(self.steps) + len(self.progress) + len(self.samples)
            + len(self.finish_updates)
        )  # fmt: skip

    def update_finish(
        self, ingest_id: int, output_tokens: int | None = None, joined_to: int | None = None
    ) -> None:
        """Record a change to a stored finish row (later changes of a field win)."""
        old_tokens, old_joined = self.finish_updates.get(ingest_id, (None, None))
        self.finish_updates[ingest_id] = (
            output_tokens if output_tokens is not None else old_tokens,
            joined_to if joined_to is not None else old_joined,
        )


def _finish_updates(updates: dict[int, tuple[int | None, int | None]]) -> pa.Table | None:
    if not updates:
        return None
    ids = list(updates)
    return pa.Table.from_arrays(
        [
            pa.array(ids, pa.int64()),
            pa.array([updates[i][0] for i in ids], pa.int64()),
            pa.array([updates[i][1] for i in ids], pa.int64()),
        ],
        schema=_FINISH_UPDATES,
    )


def _arrow_schema(conn: Connection, table: str, columns: Sequence[str]) -> pa.Schema:
    """The Arrow types of `table`'s `columns`, read from the database once per process.

    Typed columns are built three times faster than inferred ones, and inference tries
    (and fails) to import pandas on every call.
    """
    key = (table, tuple(columns))
    schema = _schemas.get(key)
    if schema is None:
        query = f"SELECT {', '.join(columns)} FROM {table} LIMIT 0"
        schema = _schemas[key] = duck_connection(conn).sql(query).to_arrow_table().schema
    return schema


@dataclass(frozen=True)
class StagedInsert:
    """An insert of Arrow rows: `sql` reads them as `rows_<table>`, a name the statement
    resolves to `rows` when run by `_execute_staged`."""

    sql: str
    name: str
    rows: pa.Table


def _staged_insert(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    rows: Sequence[tuple],
    *,
    unless: str | None = None,
) -> StagedInsert | None:
    """The insert of `rows` as one Arrow table (None for no rows); `unless` is a
    condition on the new row `r` that skips it."""
    if not rows:
        return None
    schema = _arrow_schema(conn, table, columns)
    arrays = [pa.array(column, type=field_.type) for column, field_ in
              zip(zip(*rows, strict=True), schema, strict=True)]  # fmt: skip
    name = f"rows_{table}"
    names = ", ".join(columns)
    verb = "INSERT OR REPLACE" if table in UPSERT_TABLES else "INSERT"
    where = f" WHERE NOT ({unless})" if unless else ""
    return StagedInsert(
        f"{verb} INTO {table} ({names}) SELECT {names} FROM {name} r{where}",
        name,
        pa.Table.from_arrays(arrays, schema=schema),
    )


def _execute_staged(
    conn: Connection,
    staged: Sequence[StagedInsert | None],
    statements: Sequence[str] = (),
    **tables: pa.Table,
) -> None:
    """Run the staged inserts, then `statements`, in one DuckDB call.

    One call, because every DuckDB call costs GIL hand-overs (its Arrow scan is Python),
    which a busy ingest thread makes milliseconds each. The rows are not registered as
    views: a view is a catalog write (0.4 ms each); the statement finds them instead as
    local variables of the calling frame (DuckDB's replacement scan), which is why
    `_run_scanning` takes each table's rows as a parameter of that name.
    """
    present = [insert for insert in staged if insert is not None]
    sql = ";\n".join([*(insert.sql for insert in present), *statements])
    if sql:
        rows = {insert.name: insert.rows for insert in present}
        _run_scanning(duck_connection(conn), sql, **rows, **tables)


def _run_scanning(
    duck: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    rows_events: pa.Table | None = None,
    rows_engine_steps: pa.Table | None = None,
    rows_progress_log: pa.Table | None = None,
    rows_engine_samples: pa.Table | None = None,
    rows_decisions: pa.Table | None = None,
    rows_violations: pa.Table | None = None,
    rows_ingest_state: pa.Table | None = None,
    rows_windows: pa.Table | None = None,
    rows_step_model_fits: pa.Table | None = None,
    rows_window_metrics: pa.Table | None = None,
    rows_window_trajectories: pa.Table | None = None,
    rows_finish_updates: pa.Table | None = None,
) -> None:
    """Execute `sql` with the staged rows as this frame's locals, where the statement's
    `rows_<table>` names resolve (see `_execute_staged`). A table missing here fails
    loudly: a keyword this function does not take."""
    duck.execute(sql)


def _text_literal(value: str) -> str:
    """A SQL string literal (for statements batched into one call, where parameters
    cannot go: counter names are built from validated fleet and source names)."""
    return "'" + value.replace("'", "''") + "'"


def _append(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    rows: Sequence[tuple],
    *,
    unless: str | None = None,
) -> None:
    """Append rows as one Arrow table (one columnar insert)."""
    _execute_staged(conn, [_staged_insert(conn, table, columns, rows, unless=unless)])


class ServiceStore:
    """The service's DuckDB file (migrated on open)."""

    def __init__(self, path: str | Path, threads: int = 1, memory_mb: int = 512) -> None:
        """`threads`: DuckDB worker threads. The service appends small batches; more
        threads only contend with the ingest and audit processes for the cores.
        `memory_mb`: DuckDB's buffer pool (its default is 80% of the machine), so a
        long-running service keeps a flat footprint; DuckDB spills past it."""
        self.path = Path(path)
        self.database = open_database(path)
        self.engine = self.database.engine
        #: counter names in `ingest_state` (loaded on the first commit)
        self._state_names: set[str] | None = None
        with self.engine.begin() as conn:
            conn.execute(text(f"SET threads TO {int(threads)}"))
            conn.execute(text(f"SET memory_limit = '{int(memory_mb)}MB'"))

    def close(self) -> None:
        self.database.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Connection]:
        """One write transaction; a storage failure becomes a `StorageError`."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except (duckdb.Error, DBAPIError, OSError) as error:
            cause = StorageError.caused(error)
            if cause is None:
                raise
            raise StorageError(self.path, cause) from error

    # -- writes ---------------------------------------------------------------------

    def commit(
        self,
        batch: EventBatch,
        next_ingest_id: int,
        decisions: Sequence[tuple[int, Decision]],
        violations: Sequence[tuple[int, Violation]],
        applied_through: int,
    ) -> None:
        """One transaction: the batch being acknowledged (with the id counter after it)
        and everything derived so far (with the checkpoint it reaches)."""
        counters = [("next_ingest_id", next_ingest_id), ("applied_through", applied_through)]
        counters += [(f"seq_high:{fleet}:{source}", high)
                     for (fleet, source), high in batch.seq_high.items()]  # fmt: skip
        try:
            with self._writing() as conn:
                staged = [
                    _staged_insert(conn, "events", LIFECYCLE_COLUMNS, batch.lifecycle),
                    _staged_insert(conn, "engine_steps", STEP_COLUMNS, batch.steps),
                    _staged_insert(
                        conn, "progress_log", PROGRESS_COLUMNS, list(batch.progress.values())
                    ),
                    _staged_insert(conn, "engine_samples", SAMPLE_COLUMNS, batch.samples),
                    _staged_insert(
                        conn,
                        "decisions",
                        DECISION_COLUMNS,
                        [_decision_row(i, d) for i, d in decisions],
                    ),
                    _staged_insert(
                        conn,
                        "violations",
                        VIOLATION_COLUMNS,
                        [
                            (i, v.fleet, v.kind, v.severity, v.worker, v.request_id, v.ts, v.detail)
                            for i, v in violations
                        ],
                        # One row per incident. A restart re-derives what follows the
                        # checkpoint, and the event that raised an incident before it may be
                        # gone (only a request's highest progress is kept), so a later one can
                        # raise it again.
                        unless=_INCIDENT_STORED,
                    ),
                ]
                updates, new_counters = self._staged_counters(conn, counters)
                finishes = _finish_updates(batch.finish_updates)
                if finishes is not None:  # after the inserts: the rows may be in this batch
                    updates.append(_UPDATE_FINISHES)
                    _execute_staged(
                        conn, [*staged, new_counters], updates, rows_finish_updates=finishes
                    )
                else:
                    _execute_staged(conn, [*staged, new_counters], updates)
        except BaseException:
            self._state_names = None  # new counter names may not be in the table
            raise

    def _staged_counters(
        self, conn: Connection, counters: list[tuple[str, int]]
    ) -> tuple[list[str], StagedInsert | None]:
        """What sets the counters: an UPDATE for those the table has (2.5x cheaper than
        DuckDB's upsert, which deletes and re-inserts indexed rows), and an upsert only
        for new names (a new source)."""
        if self._state_names is None:
            names = duck_connection(conn).execute("SELECT name FROM ingest_state").fetchall()
            self._state_names = {name for (name,) in names}
        known = [(name, int(value)) for name, value in counters if name in self._state_names]
        new = [(name, int(value)) for name, value in counters if name not in self._state_names]
        updates = []
        if known:
            cases = " ".join(f"WHEN {_text_literal(n)} THEN {v}" for n, v in known)
            listed = ", ".join(_text_literal(n) for n, _ in known)
            updates.append(
                f"UPDATE ingest_state SET value = CASE name {cases} END WHERE name IN ({listed})"
            )
        inserted = _staged_insert(conn, "ingest_state", STATE_COLUMNS, new)
        self._state_names.update(name for name, _ in new)  # reloaded if the commit fails
        return updates, inserted

    def compact_progress(self) -> int:
        """Fold the progress log into `progress_latest` (one row per request, never
        lowered) and empty it, in one transaction; returns the log rows folded."""
        with self._writing() as conn:
            duck = duck_connection(conn)
            rows = duck.execute("SELECT count(*) FROM progress_log").fetchone()[0]
            if rows:
                duck.execute(_FOLD_PROGRESS)
                duck.execute("DELETE FROM progress_log")
        return int(rows)

    def drop_derived_after(self, applied_through: int) -> None:
        """Forget derived rows of events after the checkpoint (they are re-derived),
        except those no stored event can derive again (`NOT_REDERIVED`)."""
        with self._writing() as conn:
            conn.execute(
                text("DELETE FROM decisions WHERE ingest_id > :after"), {"after": applied_through}
            )
            keep = ", ".join(f"'{kind}'" for kind in NOT_REDERIVED)
            conn.execute(
                text(f"DELETE FROM violations WHERE ingest_id > :after AND kind NOT IN ({keep})"),
                {"after": applied_through},
            )

    def save_windows(
        self,
        windows: Sequence[tuple[WindowResult, bool]],
        fits: Sequence[tuple[str, float, Any]] = (),
    ) -> None:
        """Window results (each with whether its step model was fitted) and step-model
        fits (fleet, fitted at, fit) in one transaction and one DuckDB call: a window
        saved on its own took four calls (its row, its metrics, its trajectories, the
        commit) and a fit two, ~19 ms of the ingest thread's wall time together, four
        times a second at 16 fleets. A window given twice keeps its last result."""
        latest = {(result.fleet, result.index): (result, fitted) for result, fitted in windows}
        window_rows, metric_rows, path_rows = [], [], []
        for result, fitted in latest.values():
            window_rows.append((
                result.fleet, result.index, result.t_start, result.t_end, result.requests,
                result.imputed, result.step_model.a_ms_per_token, result.step_model.b_ms,
                fitted, _finite(result.fidelity_imbalance), _finite(result.fidelity_step),
                result.run_start, result.run_start_held,
            ))  # fmt: skip
            metric_rows += [
                (result.fleet, result.index, policy,
                 *(_finite(metrics.get(m)) for m in WINDOW_METRICS),
                 encode_tpot(result.tpot_ms.get(policy)))
                for policy, metrics in result.metrics.items()
            ]  # fmt: skip
            path_rows += [
                (result.fleet, result.index, policy, *path.encode().values())
                for policy, path in result.trajectories.items()
            ]
        fit_rows = [
            (fleet, fitted_at, fit.a_ms_per_token, fit.b_ms, _finite(fit.r2), fit.n,
             fit.t_start, fit.t_end, fit.fallback, fit.reason)
            for fleet, fitted_at, fit in fits
        ]  # fmt: skip
        if not window_rows and not fit_rows:
            return
        metric_columns = ("fleet", "window_index", "policy", *WINDOW_METRICS, "tpot_ms")
        with self._writing() as conn:
            _execute_staged(conn, [
                _staged_insert(conn, "step_model_fits", FIT_COLUMNS, fit_rows),
                _staged_insert(conn, "windows", WINDOW_COLUMNS, window_rows),
                _staged_insert(conn, "window_metrics", metric_columns, metric_rows),
                _staged_insert(conn, "window_trajectories", TRAJECTORY_COLUMNS, path_rows),
            ])  # fmt: skip

    # -- reads ----------------------------------------------------------------------

    def state(self, name: str, default: int = 0) -> int:
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT value FROM ingest_state WHERE name = :name"), {"name": name}
            ).first()
        return int(row[0]) if row else default

    def columns(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """A query's result as numpy columns (DuckDB's native fetch, no Python rows): for
        reads of thousands of rows. Parameters are `$name` placeholders."""
        with self.engine.connect() as conn:
            return duck_connection(conn).execute(sql, params or {}).fetchnumpy()

    def memory_bytes(self) -> dict[str, int]:
        """DuckDB's memory by tag (`duckdb_memory()`: table blocks, indexes, ...): what
        its buffer pool (`memory_mb`) holds, for watching the footprint."""
        rows = self.query("SELECT tag, memory_usage_bytes FROM duckdb_memory()")
        return {row["tag"]: int(row["memory_usage_bytes"]) for row in rows}

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            result = conn.execute(text(sql), params or {})
            return [dict(row._mapping) for row in result]

    def stored_events(self) -> Iterator[tuple[float, int, int, str, dict[str, Any]]]:
        """Every stored event in apply order, as `(ts, order, ingest_id, type, fields)`.

        Lifecycle events and engine steps merge by time with the stream's class order at
        equal times; each request's latest progress comes at its own time.
        """
        order = EVENT_ORDER
        queries = {
            "events": f"SELECT {', '.join(LIFECYCLE_COLUMNS)} FROM events",
            "engine_steps": f"SELECT {', '.join(STEP_COLUMNS)} FROM engine_steps",
            "progress": f"SELECT {', '.join(PROGRESS_COLUMNS)} FROM {LATEST_PROGRESS}",
        }
        streams = []
        with self.engine.connect() as conn:
            duck = duck_connection(conn)
            for table, sql in queries.items():
                cursor = duck.execute(sql)
                names = [d[0] for d in cursor.description]
                rows = []
                for values in cursor.fetchall():
                    fields = dict(zip(names, values, strict=True))
                    kind = fields.get("type") or (
                        "engine_step" if table == "engine_steps" else "progress"
                    )
                    rows.append((fields["ts"], order[kind], fields["ingest_id"], kind, fields))
                rows.sort(key=lambda r: r[:3])
                streams.append(rows)
        yield from heapq.merge(*streams, key=lambda r: r[:3])

    def latest_progress(self, fleet: str, request_id: str) -> list[dict[str, Any]]:
        """One request's latest progress (`generated`, `ts`): the higher of its folded
        row and the log; empty when none was received."""
        return self.query(
            "SELECT generated, ts FROM (SELECT generated, ts FROM progress_latest WHERE "
            "fleet = :fleet AND request_id = :request_id UNION ALL SELECT generated, ts FROM "
            "progress_log WHERE fleet = :fleet AND request_id = :request_id) "
            "ORDER BY generated DESC LIMIT 1",
            {"fleet": fleet, "request_id": request_id},
        )

    def recent_seqs(self, window: int) -> dict[tuple[str, str], set[int]]:
        """Per (fleet, source), the stored seqs within `window` of that source's highest.
        Where retention archived rows of the source, the seqs above the highest archived
        one and that one (so every seq below it counts as seen: `RecentInts.seed`)."""
        out: dict[tuple[str, str], set[int]] = {}
        for table in ("events", "engine_steps"):
            for row in self.query(
                f"""SELECT fleet, source, seq FROM {table} t
                    WHERE seq IS NOT NULL AND seq > (
                        SELECT max(seq) FROM {table} u
                        WHERE u.fleet = t.fleet AND u.source = t.source) - :window""",
                {"window": window},
            ):
                out.setdefault((row["fleet"], row["source"]), set()).add(int(row["seq"]))
        for (fleet, source), floor in self._archived_seqs().items():
            live = out.get((fleet, source), set())
            out[(fleet, source)] = {seq for seq in live if seq > floor} | {floor}
        return out

    def _archived_seqs(self) -> dict[tuple[str, str], int]:
        rows = self.query(
            "SELECT name, value FROM ingest_state WHERE starts_with(name, :prefix)",
            {"prefix": ARCHIVED_SEQ},
        )
        out: dict[tuple[str, str], int] = {}
        for row in rows:
            fleet, source = row["name"][len(ARCHIVED_SEQ) :].split(":", 1)  # no ':' in names
            out[(fleet, source)] = int(row["value"])
        return out

    def seq_highs(self) -> dict[tuple[str, str], int]:
        """Per (fleet, source), the highest seq stored with `EventBatch.seq_high`."""
        rows = self.query("SELECT name, value FROM ingest_state WHERE name LIKE 'seq_high:%'")
        out: dict[tuple[str, str], int] = {}
        for row in rows:
            _, fleet, source = row["name"].split(":", 2)  # names have no ':' (NAME_PATTERN)
            out[(fleet, source)] = int(row["value"])
        return out

    def window_indices(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for row in self.query("SELECT fleet, window_index FROM windows"):
            out.setdefault(row["fleet"], set()).add(int(row["window_index"]))
        return out


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _decision_row(ingest_id: int, d: Decision) -> tuple:
    return (ingest_id, *d)
