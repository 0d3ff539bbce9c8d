"""Retention: rows older than a cutoff move out of the live DuckDB file into Parquet.

The archive is hive-partitioned, `<root>/table=<name>/date=YYYY-MM-DD/part-<id>.parquet`
(UTC days of `ts`), so DuckDB, Spark or Trino read it as it is. A move is done in chunks of
at most `chunk_rows` rows, each in two steps:

1. `write_chunk`, on any connection (one read snapshot): the chunk's rows are copied to a
   hidden temporary file, which is fsynced, renamed to its final name, and its directory
   fsynced; nothing in DuckDB changes.
2. `commit_chunk`, on the writer: one transaction deletes exactly those rows (the count
   must match the file's, or nothing is deleted) and lists the file in `archive_files`.

A file is part of the archive only once it is listed, and the service's readers take the
live rows plus the listed files (`table_source`). A crash before step 2 commits leaves the
rows live and the file unlisted: readers ignore it and the next run deletes it before it
starts (`remove_unlisted`), then moves the rows again. No row is lost or read twice.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Protocol

import duckdb
from sqlalchemy import Engine

from shadow.storage.database import duck_connection

DAY_S = 86_400.0


@dataclass(frozen=True)
class RetentionConfig:
    """The `[storage]` settings. A field's `metadata` holds the bounds a configured value
    must meet (`ge`, `gt`; the settings check them)."""

    #: rows whose UTC day ended more than this many days ago are archived; None: never
    retention_days: int | None = field(default=None, metadata={"ge": 1})
    #: the archive's root; None: `<database stem>.archive` beside the database file
    archive_dir: str | None = None
    #: rows per chunk: what one delete on the writer holds up ingest for
    chunk_rows: int = field(default=50_000, metadata={"ge": 100})
    #: how often the service looks for rows past retention
    every_s: float = field(default=3600.0, metadata={"gt": 0})


@dataclass(frozen=True)
class ArchivedTable:
    """A table retention moves: `key` orders its chunks (a row written later never sorts
    before the rows already written), `keep` matches rows that stay live at any age."""

    name: str
    key: str
    keep: str | None = None


#: the append-only, time-stamped tables that grow with the fleet; windows, fits, modes and
#: gate runs are small and stay live. Worker events stay: a restart rebuilds the fleet
#: from them.
TABLES = (
    ArchivedTable("events", "ingest_id", keep="type = 'worker'"),
    ArchivedTable("engine_steps", "ingest_id"),
    ArchivedTable("decisions", "ingest_id"),
    ArchivedTable("violations", "ingest_id"),
    ArchivedTable("engine_samples", "ts"),
)
TABLE_NAMES = tuple(t.name for t in TABLES)


#: `ingest_state` name prefix of the highest seq archived per (fleet, source): a restart's
#: de-duplication memory counts every seq up to it as seen (`ServiceStore.recent_seqs`)
ARCHIVED_SEQ = "archived_seq:"
#: the tables whose rows carry the seqs of their sources
SEQ_TABLES = frozenset({"events", "engine_steps"})


class ArchiveMismatch(RuntimeError):
    """The rows a delete would remove are not those written to the file (a row arrived
    in the chunk's range in between); nothing was deleted and the file is dropped."""


def archive_root(db_path: Path, archive_dir: str | Path | None = None) -> Path:
    """Where the archive of the database at `db_path` lives."""
    if archive_dir is not None:
        return Path(archive_dir).expanduser().resolve()
    db_path = Path(db_path).expanduser().resolve()
    return db_path.with_name(f"{db_path.stem}.archive")


def day_start(value: date) -> float:
    """The epoch second at which UTC day `value` begins."""
    return datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp()


def retention_cutoff(retention_days: int, now: float | None = None) -> float:
    """The start of the first UTC day that is kept: days that ended more than
    `retention_days` days before `now` are archived, whole."""
    now = time.time() if now is None else now
    return math.floor((now - retention_days * DAY_S) / DAY_S) * DAY_S


@dataclass(frozen=True)
class Chunk:
    """One written (durable, not yet listed) Parquet file and the rows it holds."""

    table: str
    day: str
    condition: str
    rows: int
    bytes: int
    ts_min: float
    ts_max: float
    path: Path


@dataclass
class ArchiveResult:
    """What one run moved, per table."""

    rows: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    files: int = 0
    days: set[str] = field(default_factory=set)
    removed_unlisted: int = 0
    #: seconds each chunk held the writer (the delete and the listing)
    commit_s: list[float] = field(default_factory=list)

    def add(self, chunk: Chunk, held_s: float) -> None:
        self.rows[chunk.table] = self.rows.get(chunk.table, 0) + chunk.rows
        self.bytes[chunk.table] = self.bytes.get(chunk.table, 0) + chunk.bytes
        self.files += 1
        self.days.add(chunk.day)
        self.commit_s.append(held_s)

    def as_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "bytes": self.bytes,
            "files": self.files,
            "days": sorted(self.days),
            "removed_unlisted": self.removed_unlisted,
            "max_commit_s": max(self.commit_s, default=0.0),
        }


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _number(value: float | int) -> str:
    """A SQL literal of a number that reads back exactly (repr of a float round-trips)."""
    return repr(int(value)) if isinstance(value, int) else repr(float(value))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stored_path(path: Path, db_dir: Path) -> str:
    """A file's name in the manifest: relative to the database's directory when inside
    it, so the database and its archive can move together."""
    try:
        return str(path.relative_to(db_dir))
    except ValueError:
        return str(path)


def write_chunk(
    duck: duckdb.DuckDBPyConnection,
    table: ArchivedTable,
    before: float,
    root: Path,
    chunk_rows: int,
) -> Chunk | None:
    """Write the next chunk of `table`'s rows older than `before` (the oldest UTC day's
    first `chunk_rows` rows by key) to a durable Parquet file; None when none are left.
    Runs in one read snapshot, so the count and the file hold the same rows."""
    keep = f" AND NOT ({table.keep})" if table.keep else ""
    oldest = duck.execute(
        f"SELECT min(ts) FROM {table.name} WHERE ts < {_number(before)}{keep}"
    ).fetchone()[0]
    if oldest is None:
        return None
    start = math.floor(oldest / DAY_S) * DAY_S
    end = min(start + DAY_S, before)
    in_day = f"ts >= {_number(start)} AND ts < {_number(end)}{keep}"
    first, last = duck.execute(
        f"SELECT min(k), max(k) FROM (SELECT {table.key} AS k FROM {table.name} "
        f"WHERE {in_day} ORDER BY {table.key} LIMIT {int(chunk_rows)})"
    ).fetchone()
    # both ends of the key: DuckDB's zone maps skip the row groups outside them
    condition = f"{in_day} AND {table.key} BETWEEN {_number(first)} AND {_number(last)}"
    rows, ts_min, ts_max = duck.execute(
        f"SELECT count(*), min(ts), max(ts) FROM {table.name} WHERE {condition}"
    ).fetchone()
    day = datetime.fromtimestamp(start, UTC).date().isoformat()
    folder = root / f"table={table.name}" / f"date={day}"
    made = [p for p in (root, folder.parent, folder) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    name = f"part-{uuid.uuid4().hex}.parquet"
    temporary, final = folder / f".{name}.tmp", folder / name
    duck.execute(
        f"COPY (SELECT * FROM {table.name} WHERE {condition} ORDER BY {table.key}) "
        f"TO {_literal(str(temporary))} (FORMAT parquet, COMPRESSION zstd)"
    )
    _fsync(temporary)
    os.replace(temporary, final)
    _fsync(folder)  # the new name is durable
    for directory in made:  # and so is every directory this chunk created
        _fsync(directory.parent)
    return Chunk(table.name, day, condition, int(rows), final.stat().st_size,
                 float(ts_min), float(ts_max), final)  # fmt: skip


def commit_chunk(duck: duckdb.DuckDBPyConnection, chunk: Chunk, db_dir: Path) -> None:
    """In the caller's transaction: delete the chunk's rows and list its file. Raises
    `ArchiveMismatch` (the caller rolls back) when the rows are not those written."""
    if chunk.table in SEQ_TABLES:
        _raise_archived_seqs(duck, chunk)
    deleted = duck.execute(f"DELETE FROM {chunk.table} WHERE {chunk.condition}").fetchone()[0]
    if deleted != chunk.rows:
        raise ArchiveMismatch(
            f"{chunk.table} {chunk.day}: {deleted} rows match the chunk, {chunk.rows} were "
            "written; nothing deleted, the chunk is moved again on the next run"
        )
    duck.execute(
        "INSERT INTO archive_files VALUES ($path, $table, $day, $rows, $bytes, $t0, $t1, $at)",
        {"path": _stored_path(chunk.path, db_dir), "table": chunk.table, "day": chunk.day,
         "rows": chunk.rows, "bytes": chunk.bytes, "t0": chunk.ts_min, "t1": chunk.ts_max,
         "at": time.time()},
    )  # fmt: skip


def _raise_archived_seqs(duck: duckdb.DuckDBPyConnection, chunk: Chunk) -> None:
    """Keep, per (fleet, source), the highest seq among archived rows: without the rows a
    restart could not tell a resent old event from a new one."""
    duck.execute(
        "INSERT INTO ingest_state SELECT "
        f"{_literal(ARCHIVED_SEQ)} || fleet || ':' || source, max(seq) FROM {chunk.table} "
        f"WHERE {chunk.condition} AND seq IS NOT NULL GROUP BY fleet, source "
        "ON CONFLICT (name) DO UPDATE SET value = greatest(value, excluded.value)"
    )


def _archive_files(root: Path) -> Iterator[Path]:
    """Every file retention may have written under `root` (finished or temporary)."""
    for table in TABLE_NAMES:
        folder = root / f"table={table}"
        if folder.is_dir():
            yield from folder.glob("date=*/*.parquet")
            yield from folder.glob("date=*/.part-*.tmp")


def remove_unlisted(engine: Engine, db_path: Path, root: Path) -> int:
    """Delete the files a crashed run left (written, never listed: their rows are still
    live); returns how many. Run only while no chunk is in flight."""
    db_dir = Path(db_path).resolve().parent
    with engine.connect() as conn:
        listed = {
            row[0]
            for row in duck_connection(conn).execute("SELECT path FROM archive_files").fetchall()
        }
    removed = 0
    for path in _archive_files(root):
        if _stored_path(path, db_dir) not in listed:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


#: runs a function on the database's writer (the service's commit thread) and returns
#: its result; offline, calling it directly
OnWriter = Callable[[Callable[[], None]], None]


def archive_before(
    engine: Engine,
    db_path: Path,
    root: Path,
    before: float,
    *,
    chunk_rows: int = 50_000,
    on_writer: OnWriter | None = None,
    pause_s: float = 0.0,
    tables: tuple[ArchivedTable, ...] = TABLES,
) -> ArchiveResult:
    """Move every archived table's rows with `ts < before` to Parquet, chunk by chunk:
    files written here, deletes run through `on_writer`, `pause_s` between chunks (room
    for the ingest's commits)."""
    db_dir = Path(db_path).resolve().parent
    run = on_writer or (lambda work: work())
    result = ArchiveResult(removed_unlisted=remove_unlisted(engine, db_path, root))
    for table in tables:
        while True:
            with engine.connect() as conn:
                duck = duck_connection(conn)
                duck.execute("BEGIN TRANSACTION")
                try:
                    chunk = write_chunk(duck, table, before, root, chunk_rows)
                finally:
                    duck.execute("ROLLBACK")
            if chunk is None:
                break
            held: list[float] = []

            def delete_and_list(chunk: Chunk = chunk, held: list[float] = held) -> None:
                started = time.perf_counter()
                with engine.begin() as conn:
                    commit_chunk(duck_connection(conn), chunk, db_dir)
                held.append(time.perf_counter() - started)

            try:
                run(delete_and_list)
            except BaseException:
                chunk.path.unlink(missing_ok=True)  # unlisted: its rows are still live
                raise
            result.add(chunk, held[0] if held else 0.0)
            if pause_s:
                time.sleep(pause_s)
    return result


# -- reading the live rows and the archive as one table ----------------------------------


class ArchiveReader(Protocol):
    """A database read that knows its file (the manifest's paths are relative to it)."""

    path: Path

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...


def archived_files(
    reader: ArchiveReader, table: str, since: float | None = None, until: float | None = None
) -> list[Path]:
    """The listed files of `table` whose rows may lie in `[since, until)`."""
    conditions = ["table_name = :table"]
    params: dict[str, Any] = {"table": table}
    if since is not None:
        conditions.append("ts_max >= :since")
        params["since"] = since
    if until is not None:
        conditions.append("ts_min < :until")
        params["until"] = until
    rows = reader.query(
        f"SELECT path FROM archive_files WHERE {' AND '.join(conditions)} ORDER BY path", params
    )
    db_dir = Path(reader.path).expanduser().resolve().parent
    return [db_dir / row["path"] for row in rows]


def table_source(
    reader: ArchiveReader,
    table: str,
    since: float | None = None,
    until: float | None = None,
    alias: str | None = None,
) -> str:
    """What a read puts after `FROM` for `table` over `[since, until)`: the table itself
    while the range does not reach into the archive, else its live rows and the listed
    files that overlap the range, as one relation named `alias` (default: the table)."""
    name = alias or table
    if table not in TABLE_NAMES:
        return table if alias is None else f"{table} {alias}"
    files = archived_files(reader, table, since, until)
    if not files:
        return table if alias is None else f"{table} {alias}"
    listed = ", ".join(_literal(str(f)) for f in files)
    return (
        f"(SELECT * FROM {table} UNION ALL BY NAME SELECT * FROM "
        f"read_parquet([{listed}], hive_partitioning = false, union_by_name = true)) AS {name}"
    )


def archive_totals(reader: ArchiveReader) -> dict[str, tuple[int, int]]:
    """Per table: the rows and bytes in the archive (for `shadow_archived_*`)."""
    rows = reader.query(
        "SELECT table_name, sum(rows) AS n, sum(bytes) AS b FROM archive_files GROUP BY 1"
    )
    return {r["table_name"]: (int(r["n"]), int(r["b"])) for r in rows}
