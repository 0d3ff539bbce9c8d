"""Read queries over the service's database, shared by the HTTP API and the gate.

Every query is fixed SQL with bound parameters; user text never reaches SQL (sort
columns and table names come from whitelists in the callers). `reader` is anything with
the store's two reads: `query` (rows as dicts, `:name` parameters) and `columns` (numpy
columns, `$name` parameters) and its database file `path`. The tables retention archives
(`shadow.storage.archive`) are read through `source`: their live rows and, when the time
range reaches into it, the archive's Parquet files, as one relation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shadow.storage.archive import table_source
from shadow.stream.join import CHILD_SEPARATOR
from shadow.stream.stored_snapshot import unpack as unpack_snapshot


class Reader(Protocol):
    """The two reads of `shadow.service.store.ServiceStore` these queries use."""

    path: Path

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def columns(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, np.ndarray]: ...


def time_range(
    column: str, since: float | None, until: float | None
) -> tuple[list[str], dict[str, Any]]:
    """The conditions `since <= column < until` (either end optional) and their bound
    parameters (`:since`, `:until`): the one time-range filter of every read."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    if since is not None:
        conditions.append(f"{column} >= :since")
        params["since"] = since
    if until is not None:
        conditions.append(f"{column} < :until")
        params["until"] = until
    return conditions, params


def source(
    reader: Reader,
    table: str,
    since: float | None = None,
    until: float | None = None,
    alias: str | None = None,
) -> str:
    """What follows `FROM` for `table` over `[since, until)` (no range: all of it): the
    live table, joined by the archive's files when the range reaches into them."""
    return table_source(reader, table, since, until, alias)


def where_fleet(
    fleet: str, column: str, since: float | None, until: float | None, alias: str = ""
) -> tuple[str, dict[str, Any]]:
    """`WHERE` text and parameters for the rows of `fleet` with `column` in the range."""
    conditions, params = time_range(f"{alias}{column}", since, until)
    return " AND ".join([f"{alias}fleet = :fleet", *conditions]), {"fleet": fleet, **params}


def page(
    reader: Reader,
    table: str,
    where: list[str],
    params: dict[str, Any],
    order: str,
    columns: str = "*",
) -> tuple[int, list[dict[str, Any]]]:
    """One page (`:limit`, `:offset` in `params`) of a table and the count of every match;
    the table, filters, columns and order are fixed SQL from the caller, never user text."""
    clause = " AND ".join(where)
    total = reader.query(f"SELECT count(*) AS n FROM {table} WHERE {clause}", params)[0]["n"]
    rows = reader.query(
        f"SELECT {columns} FROM {table} WHERE {clause} ORDER BY {order} "
        "LIMIT :limit OFFSET :offset",
        params,
    )
    return int(total), rows


# -- fleets ------------------------------------------------------------------------------


def request_events(reader: Reader, fleet: str, request_id: str) -> list[dict[str, Any]]:
    """One request's stored lifecycle events, in time order. A finish says whether its
    count is an estimate, whether the engine sent it, and `joined_to`: set on a later
    finish the join ignored (NULL on the one that finished the request).

    An n > 1 child (`<external id>#<k>`, `shadow.stream.join`) also shows the engine's
    finishes the join gave it: the engine names the parent (`<external id>`), so those rows
    are stored under the parent's id and found by their `joined_to` link with the child's
    own finish rows (either way round: whichever finished the child first is the kept one)."""
    events = source(reader, "events")
    columns = (
        "SELECT type, ts, worker, policy, prompt_tokens, output_tokens, reason, source, seq, "
        f"estimated, from_engine, joined_to FROM {events} "
    )
    params = {"fleet": fleet, "request_id": request_id}
    if CHILD_SEPARATOR not in request_id:
        return reader.query(
            columns + "WHERE fleet = :fleet AND request_id = :request_id ORDER BY ts, ingest_id",
            params,
        )
    own = f"FROM {events} WHERE fleet = :fleet AND request_id = :request_id AND type = 'finish'"
    return reader.query(
        columns + "WHERE fleet = :fleet AND (request_id = :request_id "
        f"OR (type = 'finish' AND ingest_id IN (SELECT joined_to {own} AND joined_to IS NOT NULL)) "
        f"OR (type = 'finish' AND joined_to IN (SELECT ingest_id {own}))) "
        "ORDER BY ts, ingest_id",
        params,
    )


def violation_counts(reader: Reader) -> dict[str, dict[str, Any]]:
    """Per fleet: its violations and how many of them are critical."""
    return {
        r["fleet"]: r
        for r in reader.query(
            "SELECT fleet, count(*) AS violations, "
            "count(*) FILTER (WHERE severity = 'critical') AS critical "
            f"FROM {source(reader, 'violations')} GROUP BY fleet"
        )
    }


def latest_gate_runs(reader: Reader) -> dict[str, dict[str, Any]]:
    """Per fleet: its latest gate run (`report` as stored JSON text)."""
    rows = reader.query(
        "SELECT id, ts, fleet, candidate, baseline, verdict, report FROM gate_runs "
        "QUALIFY row_number() OVER (PARTITION BY fleet ORDER BY ts DESC, id DESC) = 1"
    )
    return {row.pop("fleet"): row for row in rows}


def window_counts(reader: Reader) -> dict[str, int]:
    """Per fleet: its evaluated windows."""
    rows = reader.query("SELECT fleet, count(*) AS n FROM windows GROUP BY fleet")
    return {r["fleet"]: r["n"] for r in rows}


def latest_step_fit(reader: Reader, fleet: str) -> dict[str, Any] | None:
    rows = reader.query(
        "SELECT * FROM step_model_fits WHERE fleet = :fleet ORDER BY fitted_at DESC LIMIT 1",
        {"fleet": fleet},
    )
    return rows[0] if rows else None


# -- decisions and violations ------------------------------------------------------------

#: A decision row's stored snapshot as one BLOB: `snapshot_z` on rows stored since
#: migration 0015 (`stream.stored_snapshot.pack`), else the JSON of rows stored before
#: (`stream.stored_snapshot.unpack` reads each).
STORED_SNAPSHOT = "coalesce(snapshot_z, encode(snapshot))"
#: Every column of a decision row but its stored snapshot.
DECISION_COLUMNS_BUT_SNAPSHOT = "* EXCLUDE (snapshot, snapshot_z)"
#: Every column of a decision row, its snapshot as `STORED_SNAPSHOT` in `snapshot`.
DECISION_FIELDS = f"{DECISION_COLUMNS_BUT_SNAPSHOT}, {STORED_SNAPSHOT} AS snapshot"


def decision_latency_p99(
    reader: Reader, fleet: str, policy: str, t_start: float, t_end: float
) -> float | None:
    """P99 decision latency of `policy` on `fleet` over `[t_start, t_end)`."""
    return reader.query(
        f"SELECT quantile_cont(latency_ms, 0.99) AS p99 FROM "
        f"{source(reader, 'decisions', t_start, t_end)} WHERE fleet = :fleet "
        "AND policy = :policy AND ts >= :t0 AND ts < :t1",
        {"fleet": fleet, "policy": policy, "t0": t_start, "t1": t_end},
    )[0]["p99"]


def dispatch_decisions(reader: Reader, fleet: str, ingest_id: int) -> list[dict[str, Any]]:
    """Every policy's decision on one audited dispatch (`snapshot`: as stored, see
    `STORED_SNAPSHOT`)."""
    return reader.query(
        f"SELECT {DECISION_FIELDS} FROM {source(reader, 'decisions')} WHERE fleet = :fleet AND "
        "ingest_id = :id ORDER BY policy",
        {"fleet": fleet, "id": ingest_id},
    )


def complete_snapshot(stored: str | bytes, prompt_tokens: int) -> dict[str, Any]:
    """A dispatch's frozen snapshot as the API shows it, from what `STORED_SNAPSHOT`
    reads (`stream.stored_snapshot.unpack`), completed.

    The audit stores what cannot be derived (workers, loads, active, capacity, f_brh);
    each worker's margin and BR-0 score follow from the loads and the prompt (rows stored
    before that carry them, and keep them)."""
    snapshot = unpack_snapshot(stored)
    loads = snapshot.get("loads", [])
    if "margins" not in snapshot and loads:
        top = max(loads)
        snapshot["margins"] = [top - v for v in loads]
    if "f_br0" not in snapshot and loads:
        g = len(loads)
        snapshot["f_br0"] = [prompt_tokens - g * max(0, prompt_tokens - m)
                             for m in snapshot["margins"]]  # fmt: skip
    snapshot.setdefault("f_brh", None)
    return snapshot


def with_snapshots(reader: Reader, table: str, fleet: str, rows: list[dict[str, Any]]) -> None:
    """Give each decision row its dispatch's snapshot (`complete_snapshot`), in place.

    The audit stores a dispatch's snapshot on one of its decision rows (at G = 256 it is
    ~10 KB of JSON, and writing it once per policy was most of the server's commit time);
    the rows without it take it from that row, found in `table` by ingest id."""
    missing = sorted({int(r["ingest_id"]) for r in rows if r["snapshot"] is None})
    found: dict[int, bytes] = {}
    if missing:
        listed = ", ".join(str(i) for i in missing)
        found = {
            int(r["ingest_id"]): r["snapshot"]
            for r in reader.query(
                f"SELECT ingest_id, {STORED_SNAPSHOT} AS snapshot FROM {table} "
                f"WHERE fleet = :fleet AND ingest_id IN ({listed}) "
                f"AND {STORED_SNAPSHOT} IS NOT NULL",
                {"fleet": fleet},
            )
        }
    for row in rows:
        stored = row["snapshot"] if row["snapshot"] is not None else found.get(row["ingest_id"])
        row["snapshot"] = (
            None if stored is None else complete_snapshot(stored, row["prompt_tokens"])
        )


def violation_span(reader: Reader, fleet: str) -> tuple[float, float] | None:
    """The first and last time of the fleet's violations; None when it has none."""
    span = reader.query(
        f"SELECT min(ts) AS t0, max(ts) AS t1 FROM {source(reader, 'violations')} "
        "WHERE fleet = :fleet",
        {"fleet": fleet},
    )[0]
    return None if span["t0"] is None else (float(span["t0"]), float(span["t1"]))


def violation_buckets(
    reader: Reader, fleet: str, t0: float, width: float, buckets: int
) -> list[dict[str, Any]]:
    """Violations per kind and bucket `b` (of `width` seconds from `t0`; the last bucket
    takes what lies past it)."""
    return reader.query(
        "SELECT kind, least(CAST(floor((ts - :t0) / :width) AS BIGINT), :last) AS b, "
        f"count(*) AS n FROM {source(reader, 'violations')} WHERE fleet = :fleet "
        "GROUP BY kind, b",
        {"fleet": fleet, "t0": t0, "width": width, "last": buckets - 1},
    )


# -- windows -----------------------------------------------------------------------------


def windows_page(
    reader: Reader, fleet: str, limit: int, offset: int
) -> tuple[int, list[dict[str, Any]]]:
    """A page of the fleet's evaluated windows, oldest first."""
    return page(reader, "windows", ["fleet = :fleet"],
                {"fleet": fleet, "limit": limit, "offset": offset}, "window_index")  # fmt: skip


def window_metric_columns(
    reader: Reader, fleet: str, low: int, high: int, metrics: list[str]
) -> dict[str, np.ndarray]:
    """Per-policy `metrics` (whitelisted names) of the windows `low..high`, as columns."""
    return reader.columns(
        f"SELECT window_index, policy, {', '.join(metrics)} FROM window_metrics "
        "WHERE fleet = $fleet AND window_index BETWEEN $low AND $high",
        {"fleet": fleet, "low": low, "high": high},
    )


def summary_inputs(
    reader: Reader,
    fleet: str,
    metrics: tuple[str, ...],
    since: float | None,
    until: float | None,
    indices: list[int] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """What the comparison table is computed from, over the windows starting in
    `[since, until)` (or `indices`): their span, requests and mean fidelities, and the
    per-policy `metrics` of each as columns, with the per-request TPOTs (`tpot_ms`) and
    the window's continuous-run start (`run_start`, `run_start_held`) the gate's
    estimate needs."""
    if indices is not None:
        where = "w.fleet = :fleet AND w.window_index IN (SELECT unnest(:indices))"
        params: dict[str, Any] = {"fleet": fleet, "indices": indices or [-1]}
    else:
        where, params = where_fleet(fleet, "t_start", since, until, alias="w.")
    windows = reader.query(
        "SELECT min(t_start) AS t0, max(t_end) AS t1, sum(requests) AS requests, "
        "avg(fidelity_imbalance) AS fi, avg(fidelity_step) AS fs FROM windows w "
        f"WHERE {where}",
        params,
    )[0]
    native = re.sub(r":(\w+)", r"$\1", where)  # DuckDB's own placeholders
    columns = reader.columns(
        f"SELECT m.window_index, m.policy, {', '.join('m.' + m for m in metrics)}, "
        "m.tpot_ms, w.run_start, w.run_start_held "
        "FROM window_metrics m JOIN windows w ON m.fleet = w.fleet AND "
        f"m.window_index = w.window_index WHERE {native}",
        params,
    )
    return windows, columns


def window_bounds(
    reader: Reader,
    fleet: str,
    window: int | None = None,
    since: float | None = None,
    until: float | None = None,
) -> list[dict[str, Any]]:
    """`window_index`, `t_start`, `t_end` of one window, of the windows starting in a
    range, or (neither given) of the latest window."""
    if window is not None:
        return reader.query(
            "SELECT window_index, t_start, t_end FROM windows WHERE fleet = :fleet AND "
            "window_index = :w",
            {"fleet": fleet, "w": window},
        )
    if since is None and until is None:
        return reader.query(
            "SELECT window_index, t_start, t_end FROM windows WHERE fleet = :fleet "
            "ORDER BY window_index DESC LIMIT 1",
            {"fleet": fleet},
        )
    where, params = where_fleet(fleet, "t_start", since, until)
    return reader.query(
        f"SELECT window_index, t_start, t_end FROM windows WHERE {where} ORDER BY window_index",
        params,
    )


def trajectory_policies(reader: Reader, fleet: str) -> list[str]:
    """The policies (and `observed`) with stored trajectories on `fleet`, sorted."""
    rows = reader.query(
        "SELECT DISTINCT policy FROM window_trajectories WHERE fleet = :fleet", {"fleet": fleet}
    )
    return sorted({r["policy"] for r in rows})


def trajectories(
    reader: Reader, fleet: str, indices: list[int], policies: list[str]
) -> list[dict[str, Any]]:
    return reader.query(
        "SELECT * FROM window_trajectories WHERE fleet = :fleet AND window_index IN "
        "(SELECT unnest(:indices)) AND policy IN (SELECT unnest(:policies))",
        {"fleet": fleet, "indices": indices, "policies": policies},
    )


# -- gate runs ---------------------------------------------------------------------------


def gate_runs_page(
    reader: Reader, fleet: str, limit: int, offset: int
) -> tuple[int, list[dict[str, Any]]]:
    """A page of the fleet's gate runs, newest first (`report` as stored JSON text)."""
    return page(reader, "gate_runs", ["fleet = :fleet"],
                {"fleet": fleet, "limit": limit, "offset": offset}, "ts DESC, id DESC",
                "id, ts, candidate, baseline, verdict, exit_code, report")  # fmt: skip


def gate_run(reader: Reader, run_id: int) -> dict[str, Any] | None:
    rows = reader.query("SELECT id, ts, report FROM gate_runs WHERE id = :id", {"id": run_id})
    return rows[0] if rows else None


# -- stored replays ----------------------------------------------------------------------


def replay_runs_page(reader: Reader, limit: int, offset: int) -> tuple[int, list[dict[str, Any]]]:
    """A page of the runs `shadow replay` stored, newest first."""
    total = reader.query("SELECT count(*) AS n FROM replay_runs")[0]["n"]
    runs = reader.query(
        "SELECT id, created_at, trace, workers, batch, requests, seed, a_ms_per_token, "
        "b_ms FROM replay_runs ORDER BY id DESC LIMIT :limit OFFSET :offset",
        {"limit": limit, "offset": offset},
    )
    return int(total), runs


def replay_summaries(reader: Reader, run_ids: list[int]) -> list[dict[str, Any]]:
    """The per-policy summaries of the runs `run_ids`, by run and policy."""
    return reader.query(
        "SELECT * FROM replay_policy_summaries WHERE run_id IN (SELECT unnest(:ids)) "
        "ORDER BY run_id, policy",
        {"ids": run_ids or [-1]},
    )


def replay_run(reader: Reader, run_id: int) -> dict[str, Any] | None:
    runs = reader.query("SELECT * FROM replay_runs WHERE id = :id", {"id": run_id})
    return runs[0] if runs else None


def replay_run_summaries(reader: Reader, run_id: int) -> list[dict[str, Any]]:
    return reader.query(
        "SELECT * FROM replay_policy_summaries WHERE run_id = :id ORDER BY policy",
        {"id": run_id},
    )


def replay_step_counts(reader: Reader, run_id: int) -> list[dict[str, Any]]:
    """Per policy of the run: how many steps it stored (`policy`, `n`)."""
    return reader.query(
        "SELECT policy, count(*) AS n FROM replay_steps WHERE run_id = :id GROUP BY policy",
        {"id": run_id},
    )


def replay_step_buckets(
    reader: Reader, run_id: int, policy: str, points: int, steps: int
) -> list[dict[str, Any]]:
    """One policy's `steps` steps averaged into `points` buckets (`t`, `imbalance`,
    `step_ms`, `active` per bucket `b`)."""
    return reader.query(
        "SELECT CAST(floor(step * :points / :n) AS BIGINT) AS b, avg(start_ms) AS t, "
        "avg(max_load - min_load) AS imbalance, avg(duration_ms) AS step_ms, "
        "avg(active) AS active FROM replay_steps WHERE run_id = :id AND "
        "policy = :policy GROUP BY b ORDER BY b",
        {"id": run_id, "policy": policy, "points": points, "n": steps},
    )
