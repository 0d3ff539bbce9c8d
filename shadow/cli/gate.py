"""`shadow gate`: the promotion gate, its verdict as the exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shadow.cli.shared import DEFAULT_DB, console, err_console


def gate(
    db: Annotated[Path, typer.Option(help="The service's DuckDB file.")] = DEFAULT_DB,
    fleet: Annotated[str, typer.Option(help="Fleet to judge.")] = "default",
    candidate: Annotated[str, typer.Option(help="Policy to promote.")] = "brh-survival",
    baseline: Annotated[str, typer.Option(help="The incumbent.")] = "jsq-pool",
    since: Annotated[float | None, typer.Option(help="Evidence from this time (s).")] = None,
    until: Annotated[float | None, typer.Option(help="Evidence before this time (s).")] = None,
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file of thresholds.")
    ] = None,
    show_thresholds: Annotated[
        bool, typer.Option(help="Print the thresholds in force (TOML) and exit.")
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print everything, exit 0.")] = False,
    allow_marginal: Annotated[bool, typer.Option(help="MARGINAL exits 0.")] = False,
    explain: Annotated[
        str | None, typer.Option(help="Show the bootstrap and rule evaluation of one metric.")
    ] = None,
) -> None:
    """The promotion gate: PASS 0, FAIL 1, usage 2, INCONCLUSIVE 3, MARGINAL 4, ERROR 5."""
    from shadow.gate.command import gate_command

    code = gate_command(
        console, err_console, db=db, fleet=fleet, candidate=candidate, baseline=baseline,
        since=since, until=until, thresholds_path=thresholds, show_thresholds=show_thresholds,
        json_out=json_out, dry_run=dry_run, allow_marginal=allow_marginal, explain=explain,
    )  # fmt: skip
    raise typer.Exit(code)
