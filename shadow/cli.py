"""The `shadow` command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from shadow import __version__

app = typer.Typer(
    help="Shadow-mode evaluation of BalanceRoute against your incumbent decode router.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks that print numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
console = Console()


@app.command()
def version() -> None:
    """Print the tool version."""
    console.print(__version__)


def _split(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]


@bench_app.command("router")
def bench_router(
    policies: Annotated[
        str, typer.Option(help="Comma-separated policy names to time.")
    ] = "br0,brh-survival",
    rounds: Annotated[int, typer.Option(min=10, help="Admission rounds per case.")] = 500,
    seed: Annotated[int, typer.Option(help="Seed of the random snapshots.")] = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON to this file.")
    ] = None,
) -> None:
    """Milliseconds per admission round (P50/P99/max) at the paper's fleet shapes."""
    from shadow.bench import router
    from shadow.policies import POLICY_NAMES

    names = _split(policies)
    unknown = [name for name in names if name not in POLICY_NAMES]
    if unknown:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICY_NAMES)}",
            param_hint="--policies",
        )
    table = Table(title=f"Admission round latency ({rounds} rounds per case)")
    for column in ("policy", "G", "B", "pool", "free", "P50 ms", "P99 ms", "max ms", "P99 target"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    results = []
    total = len(names) * len(router.DEFAULT_CASES)
    with console.status("timing admission rounds") as status:
        for done, (case, result) in enumerate(
            router.run(names, router.DEFAULT_CASES, rounds, seed), start=1
        ):
            status.update(f"timing admission rounds ({done}/{total})")
            results.append(result)
            target = "-"
            if case.target_p99_ms is not None:
                met = result.p99_ms <= case.target_p99_ms
                verdict = "[green]ok" if met else "[red]MISSED"
                target = f"<= {case.target_p99_ms:g} {verdict}"
            table.add_row(
                result.policy,
                str(result.workers),
                str(result.batch),
                str(result.pool),
                str(result.free_slots),
                f"{result.p50_ms:.3f}",
                f"{result.p99_ms:.3f}",
                f"{result.max_ms:.3f}",
                target,
            )
    console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(router.as_json(results), indent=2) + "\n")
        console.print(f"wrote {json_out}")


if __name__ == "__main__":
    app()
