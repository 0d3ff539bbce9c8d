"""`shadow sweep`: replay every cell of a parameter grid x seeds, and its `--ray ADDRESS`
spelling."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from shadow.cli.shared import DEFAULT_DB, console, err_console, fail, sized_table


def sweep(
    trace: Annotated[
        str, typer.Argument(help="Trace file, or synthetic:PRESET (paper-azure2024, ...).")
    ],
    grid: Annotated[
        Path | None,
        typer.Option(help=r"Grid TOML: \[grid] name = \[v1, v2, ...], optional \[fixed] name = v."),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            help="name=v1,v2,... (repeatable; wins over --grid). Names: policy, horizon (H), "
            "alpha, beta, gamma, s_greedy, r_max, workers (G), batch (B), load, step_a, "
            "step_b, seed (seeds), limit, output_min."
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="Sweep name (default: from the grid and trace, so a rerun resumes)."),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Processes (Ray: CPUs of the local runtime); default all "
            "cores; 1 runs the cells in this process.",
        ),
    ] = None,
    ray: Annotated[
        bool, typer.Option("--ray", help="Run the cells as Ray tasks on a local Ray runtime.")
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Run on this Ray cluster (auto, ray://head:10001, ...; its nodes need this "
            "package installed); implies --ray."
        ),
    ] = None,
    trace_format: Annotated[
        str, typer.Option("--format", help="auto, azure, mooncake, jsonl or csv.")
    ] = "auto",
    limit: Annotated[int | None, typer.Option(min=1, help="Keep the first N requests.")] = None,
    output_min: Annotated[
        int | None, typer.Option(min=1, help="Keep requests with at least N output tokens.")
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option(help="Skip malformed trace rows (and count them).")
    ] = False,
    db: Annotated[Path, typer.Option(help="DuckDB file to store the cells in.")] = DEFAULT_DB,
    steps: Annotated[
        bool, typer.Option(help="Also store per-step rows (replay_steps, replay_worker_loads).")
    ] = False,
    parquet: Annotated[
        Path | None, typer.Option(help="Write every cell of the sweep to this Parquet file.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Print the cells and how many are stored, run nothing.")
    ] = False,
) -> None:
    """Replay every cell of a parameter grid x seeds; resumable, on a pool or Ray."""
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from shadow.storage import open_database
    from shadow.sweep import (
        GridError,
        PoolExecutor,
        RayExecutor,
        RayUnavailable,
        SerialExecutor,
        build_spec,
        load_grid,
        plan_sweep,
        run_sweep,
    )
    from shadow.sweep.grid import varied
    from shadow.sweep.run import prepare
    from shadow.sweep.store import EngineQuery, SweepConflict, sweep_rows, write_parquet
    from shadow.workloads.traces import TraceError

    overrides = list(param or [])
    if limit is not None:
        overrides.append(f"limit={limit}")
    if output_min is not None:
        overrides.append(f"output_min={output_min}")
    try:
        spec = load_grid(grid, overrides) if grid is not None else build_spec(overrides=overrides)
        plan = plan_sweep(
            trace,
            spec,
            name=name,
            name_hint=grid.stem if grid is not None else "sweep",
            trace_format=trace_format,
            skip_bad=skip_bad,
        )
    except GridError as error:
        raise fail(escape(str(error)), code=2) from None
    except TraceError as error:
        raise fail(escape(str(error))) from None
    except ValueError as error:
        raise fail(escape(str(error)), code=2) from None
    if ray_address is not None:
        ray = True
    params = [p.params for p in plan.cells]
    shown = ", ".join(f"{k} x{len(v)}" for k, v in spec.axes.items()) or "one cell"
    console.print(
        f"[bold]{trace}[/bold]: sweep [bold]{plan.name}[/bold], {len(plan.cells)} cells "
        f"({shown}; {spec.size()} in the product), varying {', '.join(varied(params)) or '-'}"
    )
    if spec.fixed or spec.trace:
        fixed = ", ".join(f"{k} = {v}" for k, v in {**spec.fixed, **spec.trace}.items())
        console.print(f"fixed: {fixed}")

    with open_database(db) as database:
        try:
            todo, stored = prepare(plan, database)
        except SweepConflict as error:
            raise fail(escape(str(error)), code=2) from None
        if dry_run:
            console.print(f"{stored} cells stored, {len(todo)} to run (dry run: nothing ran)")
            return
        if ray:
            executor = RayExecutor(ray_address, jobs)
        elif jobs == 1:
            executor = SerialExecutor()
        else:
            executor = PoolExecutor(jobs)
        failed = 0
        if not todo:
            console.print(f"all {stored} cells stored already; nothing to run")
        else:
            columns = (
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                "ETA",
                TimeRemainingColumn(),
            )
            try:
                with executor:
                    where = {
                        "ray": f"Ray ({executor.workers} CPUs)",
                        "serial": "this process",
                    }.get(executor.name, f"a process pool ({executor.workers} processes)")
                    console.print(f"{stored} cells stored already; running {len(todo)} on {where}")
                    with Progress(*columns, console=console) as bar:
                        task = bar.add_task("cells", total=len(todo))

                        def finished(outcome, done: int) -> None:
                            bar.update(task, completed=done)
                            if outcome.error is not None:
                                problem = escape(outcome.error)
                                bar.console.print(
                                    f"[red]cell {outcome.task.key} failed:[/red] {problem}"
                                )

                        report = run_sweep(
                            plan, database, executor, steps=steps, todo=todo, on_cell=finished
                        )
            except RayUnavailable as error:
                raise fail(escape(str(error))) from None
            except KeyboardInterrupt:
                err_console.print("interrupted: finished cells are stored; rerun to resume")
                raise typer.Exit(130) from None
            failed = len(report.failed)
            console.print(
                f"ran {report.ran} cells in {report.seconds:.1f} s "
                f"({report.cells_per_minute:.1f} cells/min)"
            )
        rows = sweep_rows(EngineQuery(database.engine), plan.name)
    _print_sweep_summary(rows)
    if parquet is not None:
        count = write_parquet(plan.name, rows, parquet)
        console.print(f"wrote {count} cells to {parquet}")
    console.print(f"stored in {db} as sweep {plan.name}")
    if failed:
        raise fail(f"{failed} cells failed; rerun to retry them")


def _print_sweep_summary(rows: list[dict]) -> None:
    from shadow.sweep.results import (
        PARAM_HEADINGS,
        POLICY_HEADINGS,
        param_table_rows,
        policy_table_rows,
        summarize_sweep,
    )

    summaries = summarize_sweep(rows)
    _print_in_two(f"Sweep: {len(rows)} cells, metrics averaged over seeds", POLICY_HEADINGS,
                  policy_table_rows(summaries), split=6)  # fmt: skip
    for summary in summaries:
        for entry in summary["params"]:
            title = f"{summary['policy']} by {entry['param']}"
            headers = (entry["param"], *PARAM_HEADINGS)
            _print_in_two(title, headers, param_table_rows(entry), split=5)
    for summary in summaries:
        console.print(summary["sentence"])
        for entry in summary["params"]:
            console.print(f"  {entry['sentence']}")


def _print_in_two(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], split: int
) -> None:
    """A wide table as two, each led by the first column: the best configuration, then
    the ranges. In one table the nine columns did not fit 80 (a CI log), and Rich cut
    policy names and ranges to 'brh-s…' and '732..…'."""
    console.print(sized_table(title, headers[:split], [row[:split] for row in rows]))
    rest = [headers[0], *headers[split:]]
    console.print(sized_table(None, rest, [[row[0], *row[split:]] for row in rows]))


_RAY_ADDRESS = re.compile(r"^(auto|local|[a-z]+://\S+|[\w.-]+:\d+)$")


def ray_address_argv(argv: list[str]) -> list[str]:
    """`shadow sweep ... --ray ADDRESS`: Click has no option with an optional value, so
    `--ray` followed by something that looks like a Ray address (auto, ray://head:10001,
    host:6379) becomes `--ray --ray-address ADDRESS`; a bare `--ray` stays local."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        out.append(argv[i])
        if argv[i] == "--ray" and i + 1 < len(argv) and _RAY_ADDRESS.match(argv[i + 1]):
            if argv[i + 1] != "local":
                out += ["--ray-address", argv[i + 1]]
            i += 1
        i += 1
    return out
