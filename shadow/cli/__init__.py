"""The `shadow` command line: the Typer app, with one module per command group.

The commands (`replay`, `sweep`, `serve`, `ingest`, `gate`) and the groups (`bench`, `db`,
`mode`, `audit`, `dashboards`) are registered here in the order `shadow --help` lists them.
"""

from __future__ import annotations

import sys

import typer

from shadow import __version__
from shadow.cli import audit, bench, dashboards, db, gate, mode, replay, service, sweep, tap
from shadow.cli.shared import WholeErrorsGroup, console
from shadow.cli.sweep import ray_address_argv

app = typer.Typer(
    help="Shadow-mode evaluation of BalanceRoute against your incumbent decode router.",
    no_args_is_help=True,
    add_completion=False,
    cls=WholeErrorsGroup,
)


@app.command()
def version() -> None:
    """Print the tool version."""
    console.print(__version__)


app.command()(replay.replay)
app.command()(sweep.sweep)
app.command()(service.serve)
app.command()(service.ingest)
app.command()(gate.gate)
app.command()(tap.tap)
app.add_typer(bench.bench_app, name="bench")
app.add_typer(db.db_app, name="db")
app.add_typer(mode.mode_app, name="mode")
app.add_typer(audit.audit_app, name="audit")
app.add_typer(dashboards.dashboards_app, name="dashboards")


def main() -> None:
    """The `shadow` command."""
    app(args=ray_address_argv(sys.argv[1:]), prog_name="shadow")


__all__ = ["app", "main", "ray_address_argv"]
