"""`shadow db`: the DuckDB database's migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shadow.cli.shared import DEFAULT_DB, console

db_app = typer.Typer(help="The DuckDB database.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(
    db: Annotated[Path, typer.Option(help="DuckDB file (created if missing).")] = DEFAULT_DB,
) -> None:
    """Apply every pending migration to the database."""
    from shadow.storage import upgrade

    revision = upgrade(db)
    console.print(f"{db}: at revision {revision}")
