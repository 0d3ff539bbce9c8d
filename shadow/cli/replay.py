"""`shadow replay`: replay a trace or preset under each policy and compare them.

The replay itself is `shadow.analysis.replay_run`'s (the path the sweep cells take too); this
module resolves the workload from the command line, draws the progress and the tables,
and writes the JSON, the event stream and the stored run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shadow.cli.shared import (
    ALL_POLICIES,
    DEFAULT_DB,
    console,
    err_console,
    fail,
    policy_names,
    sized_table,
)

if TYPE_CHECKING:
    from shadow.replay.workload import StepModel, Workload
    from shadow.workloads.traces import LoadResult


def load_workload(
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
    step_model: StepModel,
) -> tuple[LoadResult, Workload]:
    """The trace or preset as loaded, and the workload to replay (re-timed); a bad trace,
    bad filters or nothing left to replay end the command with its error."""
    from shadow.analysis.replay_run import EmptyWorkload, require_requests, retimed
    from shadow.workloads.traces import TraceError, resolve_workload

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
    try:
        workload = require_requests(loaded.workload, trace)
    except EmptyWorkload as error:
        raise fail(str(error)) from None
    workload = retimed(
        workload,
        workers=workers,
        batch=batch,
        step_model=step_model,
        load=load,
        rate_scale=rate_scale,
    )
    return loaded, workload


def _print_replay_tables(policies: dict, title: str) -> None:
    from shadow.analysis.report import DETAIL_COLUMNS, detail_rows, headline_headings, headline_rows

    headings = ["policy", *headline_headings()]
    console.print(sized_table(title, headings, list(headline_rows(policies))))
    headings = ["policy", *(heading for _, heading, _ in DETAIL_COLUMNS)]
    console.print(sized_table(None, headings, list(detail_rows(policies))))
    console.print("lower imbalance and TPOT, higher tok/s are better; ratios are against jsq")


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
    decide_on_arrival: Annotated[
        bool,
        typer.Option(
            "--decide-on-arrival/--decide-at-steps",
            help="Decide each request when it arrives, on the running step's state, as a "
            "live router does (the service replays such a fleet so); the default decides "
            "in a round before each step (BALANCEROUTE.md).",
        ),
    ] = False,
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

    from shadow.analysis.replay_run import replay_policy
    from shadow.analysis.report import replay_report
    from shadow.replay.events import write_events
    from shadow.replay.workload import StepModel

    names = policy_names(policies)
    try:
        step_model = StepModel(step_a, step_b)
    except ValueError as error:
        raise fail(str(error), code=2) from None
    loaded, workload = load_workload(
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

    runs = {}
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        for name in names:
            task = bar.add_task(f"{name:15s}", total=len(workload))
            runs[name] = replay_policy(
                workload,
                name,
                workers=workers,
                batch=batch,
                step_model=step_model,
                seed=seed,
                progress=lambda done, _total, task=task: bar.update(task, completed=done),
                decide_on_arrival=decide_on_arrival,
            )
            bar.update(task, completed=len(workload))
    summaries = {name: run.metrics for name, run in runs.items()}

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
            emit_events, runs[first].result, workload.prompt_keys, progress_every=progress_every
        )
        console.print(f"wrote {count:,} events of the {first} replay to {emit_events}")
    if db is not None and not no_db:
        from shadow import __version__
        from shadow.analysis.replay_run import store_runs
        from shadow.storage import open_database

        with open_database(db) as database:
            run_id = store_runs(
                database,
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
                runs,
            )
        console.print(f"stored as run {run_id} in {db}")
