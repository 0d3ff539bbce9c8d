"""`shadow db`: the DuckDB database's migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shadow.cli.shared import DEFAULT_DB, command_group, console, fail

db_app = command_group("The DuckDB database.")


@db_app.command("upgrade")
def db_upgrade(
    db: Annotated[Path, typer.Option(help="DuckDB file (created if missing).")] = DEFAULT_DB,
) -> None:
    """Apply every pending migration to the database."""
    from shadow.storage import upgrade

    revision = upgrade(db)
    console.print(f"{db}: at revision {revision}")


@db_app.command("archive")
def db_archive(
    before: Annotated[
        str, typer.Option(help="UTC day (YYYY-MM-DD): rows of the days before it move.")
    ],
    db: Annotated[Path, typer.Option(help="DuckDB file.")] = DEFAULT_DB,
    archive_dir: Annotated[
        Path | None,
        typer.Option(help="Archive root (default: <db stem>.archive beside the file)."),
    ] = None,
    chunk_rows: Annotated[int, typer.Option(min=100, help="Rows per file and delete.")] = 50_000,
) -> None:
    """Move the rows of the days before --before out of the database into Parquet
    (table=<name>/date=YYYY-MM-DD/), as `[storage] retention_days` does in a running
    service; with the service up, POST /v1/storage/archive instead."""
    from datetime import date

    from shadow.service.runtime import DatabaseBusy, ensure_database_free
    from shadow.storage import open_database
    from shadow.storage.archive import archive_before, archive_root, day_start

    try:
        day = date.fromisoformat(before)
    except ValueError:
        raise fail(f"--before: {before!r} is not a date (YYYY-MM-DD)") from None
    if not db.exists():
        raise fail(f"--db: {db} does not exist")
    try:
        ensure_database_free(db)
    except DatabaseBusy as error:
        raise fail(f"{error}; or POST /v1/storage/archive to the running service") from None
    root = archive_root(db, archive_dir)
    with open_database(db) as database:
        result = archive_before(database.engine, db, root, day_start(day), chunk_rows=chunk_rows)
    moved = ", ".join(f"{t} {n}" for t, n in sorted(result.rows.items())) or "nothing"
    console.print(
        f"{db}: moved {moved} rows before {day} into {result.files} files under {root} "
        f"({sum(result.bytes.values())} bytes)",
        soft_wrap=True,
    )
