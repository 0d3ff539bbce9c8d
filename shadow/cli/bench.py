"""`shadow bench`: the benchmarks that print numbers (router, ingest, load, ui, replay,
sweep, tap, bias, demo, and fleet from bench_fleet.py); each command runs one
`shadow.bench` module and draws its table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shadow.cli.bench_fleet import bench_fleet
from shadow.cli.replay import load_workload
from shadow.cli.shared import (
    ALL_POLICIES,
    BenchWorkdir,
    command_group,
    console,
    fail,
    policy_names,
    sized_table,
)

bench_app = command_group("Benchmarks that print numbers.")


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

    names = policy_names(policies)
    results = []
    #: (G, B, pool, free) -> a row per policy: a table per case fits 80 columns
    by_case: dict[tuple[int, int, int, int], list[tuple[str, ...]]] = {}
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
            shape = (result.workers, result.batch, result.pool, result.free_slots)
            by_case.setdefault(shape, []).append((
                result.policy, f"{result.p50_ms:.3f}", f"{result.p99_ms:.3f}",
                f"{result.max_ms:.3f}", f"{result.cpu_p50_ms:.3f}", f"{result.cpu_p99_ms:.3f}",
                target,
            ))  # fmt: skip
    console.print(
        f"Admission round latency in ms, wall clock and the thread's CPU time "
        f"({rounds} rounds per case)"
    )
    for (workers, batch, pool, free), rows in by_case.items():
        title = f"G = {workers}, B = {batch}, pool {pool:,}, {free} free"
        headers = ("policy", "P50", "P99", "max", "CPU P50", "CPU P99", "P99 target")
        console.print(sized_table(title, headers, rows))
    if json_out is not None:
        json_out.write_text(json.dumps(router.as_json(results), indent=2) + "\n")
        console.print(f"wrote {json_out}")


@bench_app.command("ingest")
def bench_ingest(
    requests: Annotated[int, typer.Option(min=100, help="Requests in the recorded log.")] = 10_000,
    counterfactuals: Annotated[
        bool,
        typer.Option(
            help="Windows on: every candidate's continuous counterfactual beside the ingest; "
            "the clock stops when the last window is stored."
        ),
    ] = False,
    workdir: BenchWorkdir = None,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Sustained events/s from a file and over HTTP, audit and invariants on (and with
    --counterfactuals, the continuous counterfactuals)."""
    from shadow.bench import ingest as bench

    with console.status("recording and ingesting (file, then HTTP)"):
        report = bench.run(requests, workdir, counterfactuals)
    log = report["log"]
    windows = "windows on: continuous counterfactuals" if counterfactuals else "windows off"
    title = (f"Ingest: {log['events']:,} events, 8 workers, {log['fleet_seconds']:.0f} s of "
             f"fleet time (audit + invariants on, {windows})")  # fmt: skip
    columns = ["path", "events", "seconds", "events/s", "target"]
    if counterfactuals:
        columns[2:2] = ["windows", "acknowledged at, s"]
    rows = []
    for result in report["results"]:
        met = "[green]ok" if result["events_per_s"] >= result["target"] else "[red]MISSED"
        cells = [result["path"], f"{result['events']:,}", f"{result['seconds']:.2f}",
                 f"{result['events_per_s']:,.0f}", f">= {result['target']:,.0f} {met}"]  # fmt: skip
        if counterfactuals:
            cells[2:2] = [f"{result['windows']:,}", f"{result['acknowledged_seconds']:.2f}"]
        rows.append(cells)
    console.print(sized_table(title, columns, rows))
    if counterfactuals:
        console.print(
            "seconds and events/s run until the last window is stored; 'acknowledged at' is "
            "when the last event was applied and acknowledged"
        )
    for result in report["results"]:
        if result.get("cpu_us_per_event"):
            roles = ", ".join(
                f"{role} {'n/a (its processes changed)' if us is None else f'{us:.1f}'}"
                for role, us in result["cpu_us_per_event"].items()
            )
            console.print(f"{result['path']}: CPU per event by process, us: {roles}")
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
    counterfactuals: Annotated[
        bool,
        typer.Option(
            help="Windows on: the continuous counterfactuals run for every fleet beside "
            "the ingest (off: the ingest and audit alone, as the 40,000 events/s target "
            "was first measured)."
        ),
    ] = False,
    workdir: BenchWorkdir = None,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Sustained HTTP ingest at a fixed rate, audit on; checks every acknowledged event
    is stored exactly once and reports latency and resident memory (growth after the
    first minute, for the server and its worker processes)."""
    from shadow.bench import load as bench

    report = bench.run(rate=rate, duration_s=duration, batch=batch, senders=senders,
                       duckdb_memory_mb=duckdb_memory_mb, workdir=workdir,
                       counterfactuals=counterfactuals,
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
    audit = report["audit_at_load_end"]
    console.print(f"audit: {report['decisions_audited']:,} decisions; when the load stopped "
                  f"{audit['lag_s']:.2f} s of fleet time behind, {audit['backlog_batches']:.0f} "
                  f"batches queued, {audit['skipped']:,} dispatches skipped by "
                  f"sampling")  # fmt: skip
    if counterfactuals:
        evaluated = report["windows_evaluated"]
        console.print(f"continuous counterfactuals: {evaluated['windows']:,} windows evaluated "
                      f"over {evaluated['fleets']} fleets")  # fmt: skip
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
    continuous: Annotated[
        bool,
        typer.Option(
            "--continuous",
            help="Also the continuous counterfactuals' cost: recorded traffic of "
            "paper-azure2024 ingested with them off and on, the extra CPU per simulated "
            "step and per live event.",
        ),
    ] = False,
    continuous_requests: Annotated[
        int, typer.Option(min=500, help="Requests of the recorded traffic for --continuous.")
    ] = 5_000,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Simulated steps/s and peak memory per policy (each in a fresh process)."""
    from shadow.bench import replay as bench
    from shadow.policies import is_balance_route
    from shadow.replay.workload import StepModel

    names = policy_names(policies)
    model = StepModel()
    loaded, workload = load_workload(
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
    title = (f"Replay speed: {loaded.source}, {len(workload):,} requests, G = {workers}, "
             f"B = {batch}, load {load}")  # fmt: skip
    headers = ("policy", "steps", "seconds", "steps/s", "peak RSS MiB", "before MiB", "target")
    rows: list[tuple[str, ...]] = []
    results = []
    with console.status("replaying") as status:
        for name in names:
            status.update(f"replaying {name}")
            result = bench.run(
                workload, [name], workers=workers, batch=batch, step_model=model, seed=seed
            )[0]
            results.append(result)
            goal = 8_000 if is_balance_route(name) else 30_000  # BR-0 and BR-H: 8,000
            verdict = "[green]ok" if result.steps_per_s >= goal else "[red]MISSED"
            rows.append((
                name, f"{result.steps:,}", f"{result.seconds:.2f}", f"{result.steps_per_s:,.0f}",
                f"{result.peak_rss_mib:.0f}", f"{result.baseline_rss_mib:.0f}",
                f">= {goal:,} {verdict}",
            ))  # fmt: skip
    total = sum(r.seconds for r in results)
    console.print(sized_table(title, headers, rows))
    console.print(f"all {len(results)} policies: {total:.1f} s of replay (target <= 30 s)")
    document = bench.as_json(results) | {"total_s": total}
    if continuous:
        document["continuous"] = _continuous_cost(continuous_requests, load, workers, batch)
    if json_out is not None:
        json_out.write_text(json.dumps(document, indent=2) + "\n")
        console.print(f"wrote {json_out}")


def _continuous_cost(requests: int, load: float, workers: int, batch: int) -> dict:
    from shadow.bench import counterfactuals

    with console.status(f"ingesting {requests:,} recorded requests, counterfactuals off, then on"):
        cost = counterfactuals.run(requests=requests, load=load, workers=workers, batch=batch)
    console.print(
        f"continuous counterfactuals ({', '.join(cost.policies)} and the A/A run, "
        f"{cost.windows} windows): {cost.events:,} live events, {cost.simulated_steps:,} "
        f"simulated steps; ingest CPU {cost.cpu_off_s:.2f} s off, {cost.cpu_on_s:.2f} s on"
    )
    console.print(
        f"  = {cost.us_per_simulated_step:.1f} us per simulated step, "
        f"{cost.us_per_live_event:.1f} us per live event"
    )
    return {
        "events": cost.events, "windows": cost.windows, "policies": list(cost.policies),
        "simulated_steps": cost.simulated_steps, "cpu_off_s": cost.cpu_off_s,
        "cpu_on_s": cost.cpu_on_s, "us_per_simulated_step": cost.us_per_simulated_step,
        "us_per_live_event": cost.us_per_live_event,
    }  # fmt: skip


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


@bench_app.command("tap")
def bench_tap(
    requests: Annotated[int, typer.Option(min=1, help="Streams per path.")] = 48,
    concurrency: Annotated[int, typer.Option(min=1, help="Streams at once.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=2, help="Tokens per stream.")] = 128,
    pin: Annotated[
        bool,
        typer.Option(
            "--pin/--no-pin",
            help="vLLM on half the CPUs, the tap, recorder, service and clients on the rest "
            "(sharing them, the scheduler's queue behind vLLM is what the P99 measures).",
        ),
    ] = True,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Latency the tap adds per chunk (P50/P99) and its CPU per 1,000 chunks, on real vLLM
    streams (the tiny model; set SHADOW_VLLM_PYTHON to a Python with vLLM). Starts one
    vLLM server: run it under `flock /tmp/vllm.lock` on a shared machine."""
    from shadow.bench import tap as bench

    try:
        bench.vllm_python()
    except bench.VllmUnavailable as error:
        raise fail(str(error)) from None
    with console.status("streaming through vLLM, straight and through the tap"):
        result = bench.run(requests, concurrency, max_tokens, pin)
    table = Table(title=f"Tap on real vLLM streams: {result.chunks:,} chunks through the tap, "
                  f"{result.chunks_per_s:,.0f} chunks/s")  # fmt: skip
    for column in ("measure", "P50", "P99", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    added_ok = {True: "[green]ok", False: "[red]MISSED", None: "[yellow]INCONCLUSIVE"}[
        result.p99_met
    ]
    cpu_ok = "[green]ok" if result.cpu_met else "[red]MISSED"
    table.add_row("hop straight, ms", f"{result.direct_p50_ms:.3f}", f"{result.direct_p99_ms:.3f}",
                  "")  # fmt: skip
    table.add_row("hop through the tap, ms", f"{result.tap_p50_ms:.3f}",
                  f"{result.tap_p99_ms:.3f}", "")  # fmt: skip
    table.add_row("added by the tap, ms", f"{result.added_p50_ms:.3f}",
                  f"{result.added_p99_ms:.3f}",
                  f"P99 <= {bench.TARGET_P99_ADDED_MS:g} {added_ok}")  # fmt: skip
    if result.handoff_p99_ms is not None:
        table.add_row("tap's own hand-off, ms (bucket bound)", f"<= {result.handoff_p50_ms:g}",
                      f"<= {result.handoff_p99_ms:g}", "")  # fmt: skip
    console.print(table)
    if result.engine_cpus is not None:
        engine, rest = _cpus(result.engine_cpus), _cpus(result.measure_cpus or [])
        console.print(f"vLLM ran on CPU {engine}; the tap, the recorder, the service and the "
                      f"clients on CPU {rest}")  # fmt: skip
    else:
        console.print("vLLM and the measuring side shared every CPU (--no-pin, or one CPU)")
    if result.tap_slice_us is not None:
        console.print(f"the tap ran with a {result.tap_slice_us:g} us scheduling slice "
                      "(`shadow tap --sched-slice-us`)")  # fmt: skip
    console.print(
        f"the machine stood still {result.stalls} times, {result.stalled_s:.2f} s in all (a "
        f"heartbeat that could not run for over 5 ms): {result.direct_stalled:,} straight and "
        f"{result.tap_stalled:,} tapped chunks whose hop spanned a stall are left out of the "
        "percentiles above"
    )
    if result.p99_met is None:
        console.print(
            f"the straight hop's own P99 is {result.direct_p99_ms:.1f} ms (> "
            f"{bench.NOISE_P99_MS:g} ms): this machine is too loaded to judge a 1 ms target"
        )
    console.print(
        f"tap CPU: {result.tap_cpu_s_per_1000 * 1000:.1f} ms per 1,000 chunks = "
        f"{result.tap_cpu_s_per_1000 * 100:.1f}% of a core at 1,000 chunks/s "
        f"(target <= {bench.TARGET_CPU_S_PER_1000 * 100:g}%: {cpu_ok}[/])"
    )
    if json_out is not None:
        json_out.write_text(json.dumps(bench.as_json(result), indent=2) + "\n")
        console.print(f"wrote {json_out}")


def _cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


@bench_app.command("bias")
def bench_bias(
    incumbent: Annotated[str, typer.Option(help="The recorded incumbent.")] = "jsq-pool",
    requests: Annotated[int, typer.Option(min=500, help="Requests per recorded load.")] = 10_000,
    mode: Annotated[
        str, typer.Option(help="Window mode: continuous (default) or reset.")
    ] = "continuous",
    workdir: BenchWorkdir = None,
) -> None:
    """The gate's estimates against the truth (full replays) at loads 0.8, 1.0 and 1.1."""
    import tempfile

    from shadow.bench import bias

    if mode not in ("continuous", "reset"):
        raise fail(f"--mode: must be continuous or reset, got {mode!r}", code=2)
    with tempfile.TemporaryDirectory() as scratch:
        root = workdir or Path(scratch)
        cells = []
        for load in bias.LOADS:
            with console.status(f"load {load}: recording, ingesting, judging"):
                cells += bias.measure(root, incumbent, load, requests, mode)
        console.out(bias.table(cells), highlight=False)


@bench_app.command("demo")
def bench_demo(
    seconds: Annotated[
        float, typer.Option(min=30.0, help="How long the demo runs before its table is read.")
    ] = 180.0,
    db: Annotated[
        Path | None, typer.Option(help="The demo's DuckDB file (default: a scratch one).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the comparison as JSON to this file.")
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Also write the demo's recorded arrivals as a trace (.jsonl or .csv) for "
            "`shadow replay` (the command to run is printed)."
        ),
    ] = None,
) -> None:
    """The README demo's table (BR-0, BR-H against the incumbent) after SECONDS, against
    an offline replay of the demo's own recorded arrivals; exit 1 when a ratio is off, 2 when
    the run cannot be compared (no window, restarted runs, no drain)."""
    import tempfile

    from shadow.bench import demo

    with tempfile.TemporaryDirectory() as scratch:
        path = db or Path(scratch) / "demo.duckdb"
        with console.status(f"running the demo for {seconds:g} s, then replaying its arrivals"):
            try:
                result = demo.check(path, seconds)
            except demo.DemoCheckError as error:
                raise fail(str(error), code=2) from None
    console.out(demo.table(result), highlight=False)
    if trace is not None:
        demo.export_trace(result.recording, trace)
        m = result.step_model
        console.print(
            f"recorded arrivals: {trace} (shadow replay {trace} --workers "
            f"{result.recording.workers} --batch {result.recording.batch} --step-a "
            f"{m.a_ms_per_token:g} --step-b {m.b_ms:g} --policies {result.incumbent},"
            f"br0,brh-survival --decide-on-arrival)"
        )
    if json_out is not None:
        json_out.write_text(json.dumps(result.as_dict(), indent=2))
    if not all(c.within for c in result.cells):
        raise typer.Exit(1)


bench_app.command("fleet")(bench_fleet)
