"""The `shadow` command line."""

from __future__ import annotations

import json
import re
import sys
import time
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
db_app = typer.Typer(help="The DuckDB database.", no_args_is_help=True)
mode_app = typer.Typer(
    help="A fleet's mode: shadow, live, fallback, latched. Every change needs --reason.",
    no_args_is_help=True,
)
audit_app = typer.Typer(help="The tamper-evident audit log.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(db_app, name="db")
app.add_typer(mode_app, name="mode")
app.add_typer(audit_app, name="audit")
console = Console()
err_console = Console(stderr=True)

DEFAULT_DB = Path("shadow.duckdb")
ALL_POLICIES = "random,rr,jsq,p2c,ltl,vllm-dplb,br0,brh-survival,brh-exactmatch,brh-oracle"


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error the way every command does and return the exit to raise."""
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@app.command()
def version() -> None:
    """Print the tool version."""
    console.print(__version__)


def _split(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]


def _policy_names(policies: str) -> list[str]:
    from shadow.policies import POLICY_NAMES

    names = _split(policies)
    unknown = [name for name in names if name not in POLICY_NAMES]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(POLICY_NAMES)}",
            param_hint="--policies",
        )
    return names


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

    names = _policy_names(policies)
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


@db_app.command("upgrade")
def db_upgrade(
    db: Annotated[Path, typer.Option(help="DuckDB file (created if missing).")] = DEFAULT_DB,
) -> None:
    """Apply every pending migration to the database."""
    from shadow.storage import upgrade

    revision = upgrade(db)
    console.print(f"{db}: at revision {revision}")


def _load_workload(
    trace: str,
    *,
    trace_format: str,
    seed: int,
    output_min: int | None,
    limit: int | None,
    skip_bad: bool,
    load: float | None,
    rate_scale: float | None,
    workers: int,
    batch: int,
    step_model: object,
):
    from shadow.workloads.traces import TraceError, resolve_workload, retime

    if load is not None and rate_scale is not None:
        raise typer.BadParameter("give --load or --rate-scale, not both", param_hint="--load")
    try:
        loaded = resolve_workload(
            trace,
            format=trace_format,
            seed=seed,
            output_min=output_min,
            limit=limit,
            skip_bad=skip_bad,
        )
    except TraceError as error:
        raise fail(str(error)) from None
    except ValueError as error:
        raise fail(str(error), code=2) from None
    workload = loaded.workload
    if not len(workload):
        raise fail(f"{trace}: no requests left to replay after filtering")
    if load is not None or rate_scale is not None:
        workload = retime(
            workload,
            rate_scale=rate_scale,
            load=load,
            workers=workers,
            batch=batch,
            step_model=step_model,
        )
    return loaded, workload


def _print_replay_tables(policies: dict, title: str) -> None:
    from shadow.analysis.report import DETAIL_COLUMNS, detail_rows, headline_headings, headline_rows

    headline = Table(title=title)
    headline.add_column("policy")
    for heading in headline_headings():
        headline.add_column(heading, justify="right")
    for row in headline_rows(policies):
        headline.add_row(*row)
    console.print(headline)
    detail = Table()
    detail.add_column("policy")
    for _, heading, _ in DETAIL_COLUMNS:
        detail.add_column(heading, justify="right")
    for row in detail_rows(policies):
        detail.add_row(*row)
    console.print(detail)
    console.print("lower imbalance and TPOT, higher tok/s are better; ratios are against jsq")


@app.command()
def replay(
    trace: Annotated[
        str, typer.Argument(help="Trace file, or synthetic:PRESET (paper-azure2024, ...).")
    ],
    trace_format: Annotated[
        str, typer.Option("--format", help="auto, azure, mooncake, jsonl or csv.")
    ] = "auto",
    workers: Annotated[int, typer.Option(min=1, help="Decode workers G.")] = 8,
    batch: Annotated[int, typer.Option(min=1, help="Slots per worker B.")] = 64,
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = ALL_POLICIES,
    load: Annotated[
        float | None, typer.Option(min=0.0, help="Re-time arrivals: 1.0 = fleet capacity.")
    ] = None,
    rate_scale: Annotated[
        float | None, typer.Option(min=0.0, help="Re-time arrivals: multiply the rate by X.")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Keep the first N requests.")] = None,
    output_min: Annotated[
        int | None, typer.Option(min=1, help="Keep requests with at least N output tokens.")
    ] = None,
    step_a: Annotated[float, typer.Option(help="Step model: ms per KV token.")] = 1.2e-4,
    step_b: Annotated[float, typer.Option(help="Step model: fixed ms per step.")] = 20.0,
    seed: Annotated[int, typer.Option(help="Seed for presets and randomised policies.")] = 0,
    skip_bad: Annotated[
        bool, typer.Option(help="Skip malformed trace rows (and count them).")
    ] = False,
    db: Annotated[Path | None, typer.Option(help="DuckDB file to store the run in.")] = (
        DEFAULT_DB
    ),
    no_db: Annotated[bool, typer.Option("--no-db", help="Do not store the run.")] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the report as JSON to this file.")
    ] = None,
    timing: Annotated[
        bool,
        typer.Option(
            help="Put the measured scheduler wall time (sched_ms_*) into the JSON. Off by "
            "default: without it the same seed gives byte-identical JSON."
        ),
    ] = False,
    emit_events: Annotated[
        Path | None,
        typer.Option(help="Write the first policy's event stream (NDJSON) to this file."),
    ] = None,
    progress_every: Annotated[
        int, typer.Option(min=1, help="Emitted progress: one event per N tokens per request.")
    ] = 64,
) -> None:
    """Replay a trace or preset under each policy and compare them, as in the paper."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from shadow.analysis.metrics import per_step, summarize
    from shadow.analysis.report import replay_report
    from shadow.policies import make_policy
    from shadow.replay import replay as run_replay
    from shadow.replay.events import write_events
    from shadow.replay.workload import StepModel

    names = _policy_names(policies)
    try:
        step_model = StepModel(step_a, step_b)
    except ValueError as error:
        raise fail(str(error), code=2) from None
    loaded, workload = _load_workload(
        trace,
        trace_format=trace_format,
        seed=seed,
        output_min=output_min,
        limit=limit,
        skip_bad=skip_bad,
        load=load,
        rate_scale=rate_scale,
        workers=workers,
        batch=batch,
        step_model=step_model,
    )
    if loaded.skipped:
        err_console.print(f"[yellow]skipped {loaded.skipped} malformed rows[/yellow]")
    console.print(
        f"[bold]{loaded.source}[/bold]: {len(workload):,} requests, G = {workers}, B = {batch}, "
        f"step model T = {step_model.a_ms_per_token:g} ms/token x max L + {step_model.b_ms:g} ms"
    )

    summaries: dict[str, dict[str, float]] = {}
    results = {}
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        for name in names:
            task = bar.add_task(f"{name:15s}", total=len(workload))
            result = run_replay(
                workload,
                make_policy(name, seed=seed),
                workers=workers,
                batch=batch,
                step_model=step_model,
                progress=lambda done, _total, task=task: bar.update(task, completed=done),
            )
            bar.update(task, completed=len(workload))
            results[name] = result
            summaries[name] = summarize(result)

    report = replay_report(
        trace=loaded.source,
        workers=workers,
        batch=batch,
        requests=len(workload),
        step_model=step_model,
        summaries=summaries,
    )
    measured = {name: dict(report["policies"][name]) for name in names}
    for name in names:
        for key in ("sched_ms_p50", "sched_ms_p99"):
            measured[name][key] = summaries[name][key]
    _print_replay_tables(
        measured, f"{loaded.source}: {len(workload):,} requests, G = {workers}, B = {batch}"
    )

    if not timing:
        for metrics in report["policies"].values():
            metrics["sched_ms_p50"] = metrics["sched_ms_p99"] = None
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_out}")
    if emit_events is not None:
        first = names[0]
        count = write_events(
            emit_events, results[first], workload.prompt_keys, progress_every=progress_every
        )
        console.print(f"wrote {count:,} events of the {first} replay to {emit_events}")
    if db is not None and not no_db:
        from shadow import __version__
        from shadow.storage import open_database

        with open_database(db) as database:
            steps = {}
            for name, result in results.items():
                series = per_step(result)
                steps[name] = {
                    "start_ms": result.step_start_ms,
                    "duration_ms": result.step_duration_ms,
                    "max_load": series["max"],
                    "min_load": series["min"],
                    "sum_load": series["sum"],
                    "active": result.worker_active.sum(axis=1),
                }
            run_id = database.save_replay(
                {
                    "trace": loaded.source,
                    "workers": workers,
                    "batch": batch,
                    "requests": len(workload),
                    "a_ms_per_token": step_model.a_ms_per_token,
                    "b_ms": step_model.b_ms,
                    "seed": seed,
                    "config_json": json.dumps(
                        {
                            "policies": names,
                            "load": load,
                            "rate_scale": rate_scale,
                            "limit": limit,
                            "output_min": output_min,
                            "format": trace_format,
                        },
                        sort_keys=True,
                    ),
                    "tool_version": __version__,
                },
                summaries,
                steps,
                {name: r.worker_load for name, r in results.items()},
                {name: r.worker_active for name, r in results.items()},
            )
        console.print(f"stored as run {run_id} in {db}")


@app.command()
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
    overview = Table(title=f"Sweep: {len(rows)} cells, metrics averaged over seeds")
    for heading in POLICY_HEADINGS:
        overview.add_column(
            heading, justify="left" if heading in ("policy", "best at") else "right"
        )
    for row in policy_table_rows(summaries):
        overview.add_row(*row)
    console.print(overview)
    for summary in summaries:
        for entry in summary["params"]:
            table = Table(title=f"{summary['policy']} by {entry['param']}")
            table.add_column(entry["param"], justify="right")
            for heading in PARAM_HEADINGS:
                table.add_column(heading, justify="left" if heading == "best at" else "right")
            for row in param_table_rows(entry):
                table.add_row(*row)
            console.print(table)
    for summary in summaries:
        console.print(summary["sentence"])
        for entry in summary["params"]:
            console.print(f"  {entry['sentence']}")


def _settings(config: Path | None, **overrides: object):
    from shadow.service.settings import load_settings

    try:
        return load_settings(config, **overrides)
    except ValueError as error:
        raise fail(str(error), code=2) from None


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.")] = None,
    db: Annotated[Path | None, typer.Option(help="DuckDB file (default shadow.duckdb).")] = None,
    config: Annotated[
        Path | None, typer.Option(help="TOML settings file (see docs/SERVICE.md).")
    ] = None,
    demo: Annotated[
        bool | None,
        typer.Option(
            "--demo/--no-demo",
            help="Also run an emulated fleet, JSQ router, SSE tap and traffic. The default "
            "when no config file and no engines are given.",
        ),
    ] = None,
) -> None:
    """Run the shadow service: ingest, mirror, audit, invariants, windows, JSON API."""
    import uvicorn

    from shadow.service.http.app import create_app
    from shadow.service.interpreter import tune_interpreter
    from shadow.service.runtime import DatabaseBusy, ensure_database_free

    settings = _settings(config, host=host, port=port, db=db)
    try:
        ensure_database_free(settings.db)
    except DatabaseBusy as error:
        raise fail(str(error)) from None
    if demo is None:
        demo = config is None and not settings.engines and not settings.demo
        demo = demo or settings.demo
    update: dict[str, object] = {"demo": demo}
    if demo and config is None:
        update["window_s"] = 10.0  # windows within seconds for a newcomer
    settings = settings.model_copy(update=update)
    url = f"http://{settings.host}:{settings.port}"
    console.print(f"[bold]shadow service[/bold] on {url}   database {settings.db}")
    console.print(f"  web UI: [bold]{url}/[/bold]    API: {url}/docs    fleets: {url}/v1/fleets")
    if demo:
        console.print(
            f"  demo: {settings.demo_workers} emulated decode workers behind a JSQ router and "
            f"the SSE tap, with traffic; live mirror at {url}/v1/fleets/{settings.fleet}/snapshot"
            f", decisions at {url}/v1/fleets/{settings.fleet}/decisions, router address at "
            f"{url}/v1/demo"
        )
    console.print("  Ctrl-C stops everything")
    service = create_app(settings)
    tune_interpreter()
    uvicorn.run(service, host=settings.host, port=settings.port, log_level="warning")


@app.command()
def ingest(
    events: Annotated[Path, typer.Argument(help="Event log (NDJSON, optionally .gz).")],
    db: Annotated[Path | None, typer.Option(help="DuckDB file (default shadow.duckdb).")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML settings file.")] = None,
    batch: Annotated[int, typer.Option(min=1, help="Events per committed batch.")] = 10_000,
    windows: Annotated[
        bool, typer.Option(help="Replay windows counterfactually (--no-windows to skip).")
    ] = True,
    show_errors: Annotated[int, typer.Option(help="Rejected events to list.")] = 20,
) -> None:
    """Ingest a recorded event log through the same path as POST /v1/events."""
    from rich.markup import escape
    from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TimeElapsedColumn

    from shadow.events import iter_file
    from shadow.service.interpreter import tune_interpreter
    from shadow.service.runtime import DatabaseBusy, Runtime
    from shadow.service.store import StorageError

    if not events.exists():
        raise fail(f"{events}: no such file", code=2)
    if not events.is_file():
        raise fail(f"{events}: not a regular file (a directory or device?)", code=2)
    settings = _settings(config, db=db, windows=windows)
    try:
        runtime = Runtime(settings)
    except (DatabaseBusy, StorageError) as error:
        raise fail(escape(str(error))) from None
    tune_interpreter()
    totals = {"accepted": 0, "duplicates": 0, "rejected": 0}
    errors = []
    started = time.perf_counter()
    try:
        columns = (
            SpinnerColumn(),
            "[progress.description]{task.description}",
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("events", total=None)
            for pairs, rejected in iter_file(events, batch_size=batch):
                result = runtime.pipeline.submit(pairs, rejected)
                for key in totals:
                    totals[key] += getattr(result, key)
                errors.extend(rejected[: max(0, show_errors - len(errors))])
                bar.update(task, completed=sum(totals.values()))
            bar.update(task, description="events applied; replaying windows")
            runtime.pipeline.finish()
    except StorageError as error:
        stored = f"{totals['accepted']:,} events of earlier batches are stored"
        raise fail(escape(f"{error}; {stored}")) from None
    finally:
        runtime.close()
    elapsed = time.perf_counter() - started
    for error in errors:
        err_console.print(f"[yellow]rejected[/yellow] {error.describe()}")
    rate = (totals["accepted"] + totals["duplicates"]) / elapsed if elapsed else 0.0
    console.print(
        f"{events}: {totals['accepted']:,} accepted, {totals['duplicates']:,} duplicates, "
        f"{totals['rejected']:,} rejected in {elapsed:.1f} s ({rate:,.0f} events/s); "
        f"{runtime.pipeline.windows_evaluated} windows replayed; stored in {settings.db}"
    )
    if totals["rejected"]:
        raise typer.Exit(1)


@app.command()
def gate(
    db: Annotated[Path, typer.Option(help="The service's DuckDB file.")] = DEFAULT_DB,
    fleet: Annotated[str, typer.Option(help="Fleet to judge.")] = "default",
    candidate: Annotated[str, typer.Option(help="Policy to promote.")] = "brh-survival",
    baseline: Annotated[str, typer.Option(help="The incumbent.")] = "jsq",
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


UrlOption = Annotated[
    str | None, typer.Option(help="A running service (e.g. http://127.0.0.1:8321) instead of --db.")
]
DbOption = Annotated[Path, typer.Option(help="DuckDB file (when the service is stopped).")]


def _mode_action(
    action: str, fleet: str, reason: str, db: Path, url: str | None, **extra: object
) -> None:
    if not reason.strip():
        raise typer.BadParameter("a reason is required", param_hint="--reason")
    if url is not None:
        import httpx

        body = {"action": action, "reason": reason, "actor": "cli", **{
            k: v for k, v in extra.items() if v is not None}}  # fmt: skip
        response = httpx.post(f"{url.rstrip('/')}/v1/fleets/{fleet}/mode", json=body, timeout=30)
        if response.status_code != 200:
            raise fail(f"{response.status_code}: {response.json().get('detail')}")
        console.print_json(data=response.json())
        return
    from shadow.modes import ModeError, ModeStore, freeze, reset, resume, set_mode
    from shadow.storage import open_database

    with open_database(db) as database:
        store = ModeStore(database.engine)
        functions = {"set": set_mode, "freeze": freeze, "resume": resume, "reset": reset}
        args: list[object] = [reason]
        kwargs: dict[str, object] = {}
        if action == "set":
            from shadow.gate.record import last_verdict

            policy = extra.get("policy") or store.get(fleet).policy
            args = [extra["mode"], reason, extra.get("policy")]
            kwargs["last_gate_verdict"] = last_verdict(database.engine, fleet, policy)
        try:
            store.apply(fleet, functions[action], *args, actor="cli", **kwargs)
        except ModeError as error:
            raise fail(str(error)) from None
        state = store.get(fleet)
        console.print(f"{fleet}: {state.mode.value} (policy {state.policy}, frozen {state.frozen})")


@mode_app.command("show")
def mode_show(
    fleet: Annotated[str, typer.Option()] = "default", db: DbOption = DEFAULT_DB,
    url: UrlOption = None,
) -> None:  # fmt: skip
    """Print a fleet's mode."""
    if url is not None:
        import httpx

        console.print_json(data=httpx.get(f"{url.rstrip('/')}/v1/fleets/{fleet}/mode").json())
        return
    from shadow.modes import ModeStore
    from shadow.storage import open_database

    with open_database(db) as database:
        state = ModeStore(database.engine).get(fleet)
    console.print(
        f"{fleet}: {state.mode.value}, policy {state.policy}, trips {len(state.trips)}, "
        f"healthy windows {state.healthy_windows}, frozen {state.frozen}, "
        f"last gate verdict {state.last_gate_verdict}"
    )


@mode_app.command("set")
def mode_set(
    mode: Annotated[str, typer.Argument(help="shadow, live, fallback or latched.")],
    reason: Annotated[str, typer.Option(help="Why (required, audited).")],
    fleet: Annotated[str, typer.Option()] = "default",
    policy: Annotated[str | None, typer.Option(help="The policy to promote (live).")] = None,
    db: DbOption = DEFAULT_DB,
    url: UrlOption = None,
) -> None:
    """Promote, demote or force a mode (promoting after a FAIL verdict is refused)."""
    _mode_action("set", fleet, reason, db, url, mode=mode, policy=policy)


def _operator_command(action: str, summary: str) -> None:
    """Register `shadow mode ACTION`: the same options for freeze, resume and reset."""

    def command(
        reason: Annotated[str, typer.Option(help="Why (required, audited).")],
        fleet: Annotated[str, typer.Option()] = "default",
        db: DbOption = DEFAULT_DB,
        url: UrlOption = None,
    ) -> None:
        _mode_action(action, fleet, reason, db, url)

    command.__doc__ = summary
    mode_app.command(action)(command)


_operator_command("freeze", "Stop automatic mode changes.")
_operator_command("resume", "Allow automatic mode changes again.")
_operator_command("reset", "Back to shadow from fallback or latched, trips cleared.")


@audit_app.command("verify")
def audit_verify(db: DbOption = DEFAULT_DB, url: UrlOption = None) -> None:
    """Recompute the audit log's hash chain; exit 1 at the first row that does not match."""
    if url is not None:
        import httpx

        result = httpx.get(f"{url.rstrip('/')}/v1/audit/verify", timeout=60).json()
        ok, rows, bad, problem = (
            result["ok"],
            result["rows"],
            result["first_bad_seq"],
            result["problem"],
        )
    else:
        if not db.exists():
            raise fail(f"{db}: no such database", code=2)
        from shadow.modes import auditlog
        from shadow.storage import open_database

        with open_database(db) as database:
            verdict = auditlog.verify(database.engine)
        ok, rows, bad, problem = verdict.ok, verdict.rows, verdict.first_bad_seq, verdict.problem
    if ok:
        console.print(f"audit log intact: {rows} rows, hash chain verified")
        return
    raise fail(f"audit log broken at row {bad}: {problem}")


#: where `bench ingest` and `bench load` keep their files
BenchWorkdir = Annotated[
    Path | None,
    typer.Option(
        help="Keep the recording and databases here (default: a temporary folder, "
        "removed afterwards)."
    ),
]


@bench_app.command("ingest")
def bench_ingest(
    requests: Annotated[int, typer.Option(min=100, help="Requests in the recorded log.")] = 10_000,
    workdir: BenchWorkdir = None,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Sustained events/s from a file and over HTTP, audit and invariants on."""
    from shadow.bench import ingest as bench

    with console.status("recording and ingesting (file, then HTTP)"):
        report = bench.run(requests, workdir)
    log = report["log"]
    table = Table(
        title=f"Ingest: {log['events']:,} events, 8 workers, {log['fleet_seconds']:.0f} s "
        "of fleet time (audit + invariants on, windows off)"
    )
    for column in ("path", "events", "seconds", "events/s", "target"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for result in report["results"]:
        met = "[green]ok" if result["events_per_s"] >= result["target"] else "[red]MISSED"
        table.add_row(
            result["path"], f"{result['events']:,}", f"{result['seconds']:.2f}",
            f"{result['events_per_s']:,.0f}", f">= {result['target']:,.0f} {met}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"database: {report['database_bytes'] / 2**20:.1f} MiB for {log['fleet_seconds']:.0f} s "
        f"of fleet time, about {report['database_bytes_per_day_8_workers'] / 2**30:.2f} GiB "
        "per day of an 8-worker fleet"
    )
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_out}")


@bench_app.command("load")
def bench_load(
    rate: Annotated[float, typer.Option(min=1, help="Target events per second.")] = 40_000.0,
    duration: Annotated[float, typer.Option(min=1, max=600, help="Seconds of load.")] = 300.0,
    batch: Annotated[int, typer.Option(min=1, help="Events per POST.")] = 2000,
    senders: Annotated[
        int, typer.Option(min=1, help="Concurrent HTTP clients (event sources).")
    ] = 16,
    duckdb_memory_mb: Annotated[
        int,
        typer.Option(
            min=64,
            help="The server's DuckDB buffer pool: small, so that it fills during the "
            "warm-up and the memory judged after it is the rest of the service's.",
        ),
    ] = 64,
    workdir: BenchWorkdir = None,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Sustained HTTP ingest at a fixed rate, audit on; checks every acknowledged event
    is stored exactly once and reports latency and resident memory (growth after the
    first minute, for the server and its worker processes)."""
    from shadow.bench import load as bench

    report = bench.run(rate=rate, duration_s=duration, batch=batch, senders=senders,
                       duckdb_memory_mb=duckdb_memory_mb, workdir=workdir,
                       note=lambda m: console.print(m))  # fmt: skip
    latency, rss = report["latency_ms"], report["rss_mib"]
    console.print(
        f"{report['events_acknowledged']:,} events acknowledged in {report['duration_s']:.0f} s "
        f"= {report['events_per_s']:,.0f} events/s (target {rate:,.0f}); "
        f"{report['failed_batches']} of {report['batches']} batches failed"
    )
    behind = report["behind_schedule_s"]
    console.print(
        f"sustained: {report['sustained_events_per_s']:,.0f} events/s acknowledged while the "
        f"load ran ({report['events_offered']:,} offered); senders behind schedule "
        f"{behind['end']:.2f} s at the end, {behind['max']:.2f} s at worst"
    )
    console.print(f"ingest latency per batch of {batch}: P50 {latency['p50']:.0f} ms, "
                  f"P99 {latency['p99']:.0f} ms, max {latency['max']:.0f} ms")  # fmt: skip
    cpu, workers = report["server_cpu_us_per_event"], report["workers_cpu_us_per_event"]
    if cpu is not None and workers is not None:
        console.print(f"CPU per event (median of the {bench.INTERVAL_S:.0f} s intervals after "
                      f"the warm-up, min-max): server "
                      f"{cpu['median']:.1f} us ({cpu['min']:.1f}-{cpu['max']:.1f}), worker "
                      f"processes {workers['median']:.1f} us ({workers['min']:.1f}-"
                      f"{workers['max']:.1f})")  # fmt: skip
    commits = report["commits"]
    console.print(f"group commit: {commits['batches']:,.0f} batches in "
                  f"{commits['transactions']:,.0f} transactions "
                  f"({commits['batches_per_transaction']:.2f} per transaction), the commit "
                  f"thread busy {commits['busy_fraction']:.0%} of the time")  # fmt: skip
    console.print(f"stored: {report['stored']}; lost: {report['lost'] or 'none'}; "
                  f"duplicates: {report['duplicates']}; invariant violations: "
                  f"{report['violations'] or 'none'}")  # fmt: skip
    console.print(f"resident memory (server + audit worker): {rss['after_warmup']:,.0f} MiB "
                  f"after warm-up, {rss['end']:,.0f} MiB at the end, max "
                  f"{rss['max_after_warmup']:,.0f} MiB")  # fmt: skip
    if rss["growth_mib_per_min"] is not None:
        console.print(f"growth after warm-up: {rss['growth_mib_per_min']:+.1f} MiB/min (server "
                      f"{rss['server_growth_mib_per_min']:+.1f}, worker processes "
                      f"{rss['workers_growth_mib_per_min']:+.1f})")  # fmt: skip
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_out}")


@bench_app.command("ui")
def bench_ui(
    hours: Annotated[float, typer.Option(min=0.1, help="Hours of fleet data to build.")] = 24.0,
    db: Annotated[
        Path | None,
        typer.Option(help="Keep the built database here (reused if it exists)."),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed loads per page.")] = 3,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Page loads in Chromium (navigation to drawn) with a day of 8-worker data."""
    from shadow.bench import ui as bench

    report = bench.run(db, hours=hours, repeats=repeats, note=lambda m: console.print(m))
    table = Table(title=f"UI page loads, {hours:g} h of 8-worker data "
                  f"({report['build']['database_bytes'] / 2**20:,.0f} MiB database)")  # fmt: skip
    for column in ("page", "median ms", "max ms", "target"):
        table.add_column(column, justify="left" if column == "page" else "right")
    for name, timing in report["pages"].items():
        met = "[green]ok" if timing["max_ms"] < report["target_ms"] else "[red]MISSED"
        table.add_row(name, f"{timing['median_ms']:.0f}", f"{timing['max_ms']:.0f}",
                      f"< {report['target_ms']:.0f} {met}")  # fmt: skip
    console.print(table)
    api = Table(title="API calls behind the pages")
    for column in ("call", "median ms", "max ms", "KiB"):
        api.add_column(column, justify="left" if column == "call" else "right")
    for name, timing in report["api"].items():
        api.add_row(name, f"{timing['median_ms']:.0f}", f"{timing['max_ms']:.0f}",
                    f"{timing['bytes'] / 1024:,.0f}")  # fmt: skip
    console.print(api)
    console.print(f"service start (re-applies the recorded events): {report['startup_s']:.1f} s")
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_out}")


@bench_app.command("replay")
def bench_replay(
    trace: Annotated[str, typer.Argument(help="Trace file or synthetic:PRESET.")] = (
        "synthetic:paper-azure2024"
    ),
    workers: Annotated[int, typer.Option(min=1)] = 8,
    batch: Annotated[int, typer.Option(min=1)] = 64,
    load: Annotated[float, typer.Option(min=0.0, help="1.0 = fleet capacity.")] = 1.0,
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = ALL_POLICIES,
    seed: Annotated[int, typer.Option()] = 0,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Simulated steps/s and peak memory per policy (each in a fresh process)."""
    from shadow.bench import replay as bench
    from shadow.replay.workload import StepModel

    names = _policy_names(policies)
    model = StepModel()
    loaded, workload = _load_workload(
        trace,
        trace_format="auto",
        seed=seed,
        output_min=None,
        limit=None,
        skip_bad=False,
        load=load,
        rate_scale=None,
        workers=workers,
        batch=batch,
        step_model=model,
    )
    table = Table(
        title=f"Replay speed: {loaded.source}, {len(workload):,} requests, "
        f"G = {workers}, B = {batch}, load {load}"
    )
    for column in ("policy", "steps", "seconds", "steps/s", "peak RSS MiB", "before MiB", "target"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    results = []
    with console.status("replaying") as status:
        for name in names:
            status.update(f"replaying {name}")
            result = bench.run(
                workload, [name], workers=workers, batch=batch, step_model=model, seed=seed
            )[0]
            results.append(result)
            goal = 8_000 if name.startswith("br") else 30_000  # BR-0 and BR-H: 8,000
            verdict = "[green]ok" if result.steps_per_s >= goal else "[red]MISSED"
            table.add_row(
                name,
                f"{result.steps:,}",
                f"{result.seconds:.2f}",
                f"{result.steps_per_s:,.0f}",
                f"{result.peak_rss_mib:.0f}",
                f"{result.baseline_rss_mib:.0f}",
                f">= {goal:,} {verdict}",
            )
    total = sum(r.seconds for r in results)
    console.print(table)
    console.print(f"all {len(results)} policies: {total:.1f} s of replay (target <= 30 s)")
    if json_out is not None:
        json_out.write_text(
            json.dumps(bench.as_json(results) | {"total_s": total}, indent=2) + "\n"
        )
        console.print(f"wrote {json_out}")


@bench_app.command("sweep")
def bench_sweep(
    trace: Annotated[str, typer.Argument(help="Trace file or synthetic:PRESET.")] = (
        "synthetic:paper-azure2024"
    ),
    limit: Annotated[int, typer.Option(min=1, help="Requests per cell.")] = 3000,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per configuration (9 each).")] = 5,
    ray: Annotated[bool, typer.Option(help="Also time a local Ray runtime.")] = True,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Sweep cells per minute on a process pool (1, 2 workers) and Ray, and Ray's overhead."""
    from shadow.bench import sweep as bench
    from shadow.sweep import GridError, RayUnavailable

    executors = [("pool", 1), ("pool", 2)] + ([("ray", 2)] if ray else [])
    try:
        report = bench.run(
            trace,
            bench.default_spec(limit=limit, seeds=seeds),
            executors,
            note=lambda m: console.print(m),
        )
    except (GridError, ValueError) as error:
        raise fail(str(error), code=2) from None
    except RayUnavailable as error:
        raise fail(f"{error} (or pass --no-ray)") from None
    table = Table(
        title=f"Sweep throughput: {report['cells']} BR-H cells of {report['requests']:,} "
        f"requests ({trace}, G = 8, load 1.0)"
    )
    columns = ("executor", "workers", "cells", "start-up s", "wall s", "cells/min", "CPU share")
    for column in columns:
        table.add_column(column, justify="left" if column == "executor" else "right")
    for r in report["results"]:
        share = "-" if r["cpu_share"] is None else f"{r['cpu_share']:.0%}"
        table.add_row(
            r["executor"], str(r["workers"]), str(r["cells"]), f"{r['startup_s']:.1f}",
            f"{r['wall_s']:.1f}", f"{r['cells_per_min']:.1f}", share,
        )  # fmt: skip
    console.print(table)
    console.print(
        "wall time includes starting the processes (and ray.init); CPU share: the pool's "
        "CPU time / (wall x workers), below 100% when its workers waited for a core"
    )
    overhead = report["ray_overhead"]
    if overhead:
        console.print(
            f"Ray vs the pool ({overhead['workers']} workers): {overhead['wall']:+.1%} wall time, "
            f"{overhead['wall_without_init']:+.1%} without ray.init ({overhead['init_s']:.1f} s)"
        )
    same = "[green]yes" if report["identical"] else "[red]NO"
    console.print(f"every executor gave the same results cell for cell: {same}")
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_out}")
    if not report["identical"]:
        raise typer.Exit(1)


dashboards_app = typer.Typer(
    help="Grafana dashboards: export the JSON built from code, or provision a Grafana.",
    no_args_is_help=True,
)
app.add_typer(dashboards_app, name="dashboards")


@dashboards_app.command("export")
def dashboards_export(
    directory: Annotated[
        Path, typer.Argument(help="Where to write the dashboard JSON files.")
    ] = Path("dashboards"),
) -> None:
    """Write every dashboard as `<uid>.json` (the same bytes on every run)."""
    from shadow import dashboards

    for path in dashboards.export(directory):
        console.print(f"wrote {path}")


@dashboards_app.command("provision")
def dashboards_provision(
    url: Annotated[str, typer.Option(help="Grafana base URL, e.g. http://grafana:3000.")],
    token: Annotated[
        str, typer.Option(help="Service account token (Editor or Admin).", envvar="GRAFANA_TOKEN")
    ],
    folder: Annotated[str, typer.Option(help="Folder title (created if missing).")] = (
        "balanceroute-shadow"
    ),
    datasource_url: Annotated[
        str | None,
        typer.Option(help="Prometheus URL: create or update the shadow-prometheus datasource."),
    ] = None,
) -> None:
    """Create or overwrite the dashboards in a Grafana folder; safe to rerun."""
    from shadow import dashboards

    try:
        summary = dashboards.provision(url, token, folder=folder, datasource_url=datasource_url)
    except dashboards.ProvisionError as error:
        raise fail(str(error)) from None
    found = summary["folder"]
    console.print(f"folder {found['title']!r} (uid {found['uid']}): {found['action']}")
    if summary["datasource"] is not None:
        source = summary["datasource"]
        console.print(f"datasource {source['name']} -> {source['url']}: {source['action']}")
    for board in summary["dashboards"]:
        console.print(
            f"dashboard {board['title']!r} (uid {board['uid']}, version {board['version']}): "
            f"{board['action']}"
        )


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


def main() -> None:
    """The `shadow` command."""
    app(args=ray_address_argv(sys.argv[1:]), prog_name="shadow")


if __name__ == "__main__":
    main()
