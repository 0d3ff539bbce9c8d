"""`shadow bench fleet`: keep pace with a wide-EP fleet (issue 24). Its options and its
report (the audit's cost per dispatch, the ingest passes' rates, lag, CPU and memory by
process, GiB per day) are the longest of the benchmarks', so they live apart from
`cli/bench.py`, which registers the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from shadow.cli.shared import BenchWorkdir, console, fail, sized_table


def bench_fleet(
    workers: Annotated[int, typer.Option(min=1, max=1024, help="Decode workers (G).")] = 256,
    batch: Annotated[int, typer.Option(min=1, help="Slots per worker (B).")] = 128,
    minutes: Annotated[
        float, typer.Option(min=0.1, max=60, help="Minutes of fleet time to generate.")
    ] = 5.0,
    seed: Annotated[int, typer.Option(help="Seed of the preset.")] = 0,
    http: Annotated[
        bool, typer.Option(help="Also ingest over HTTP at the fleet's real-time rate.")
    ] = True,
    audit_sampling: Annotated[
        bool,
        typer.Option(help="Let the audit take an even sample of dispatches while it lags."),
    ] = False,
    counterfactuals: Annotated[
        bool,
        typer.Option(
            help="Also evaluate the windows: every candidate's continuous counterfactual."
        ),
    ] = False,
    max_audit_backlog: Annotated[
        int | None,
        typer.Option(
            min=2,
            help="The audit's backlog bound in batches (the service's default unless given); "
            "with --audit-sampling it samples from half of it.",
        ),
    ] = None,
    duckdb_memory_mb: Annotated[
        int | None,
        typer.Option(
            min=64,
            help="The server's DuckDB buffer pool in MiB (the service's default, 512, unless "
            "given; `bench load` runs at 64): a pool filling toward its bound is resident "
            "memory growing.",
        ),
    ] = None,
    workdir: BenchWorkdir = None,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Keep pace with a wide-EP fleet: generate its event stream, time the audit per
    dispatch, ingest it from a file as fast as it goes and over HTTP at its real-time rate
    (audit and invariants on); rates, audit lag, CPU per event, memory, GiB per day."""
    from shadow.bench import fleet as bench

    try:
        shape = bench.FleetShape(workers, batch, minutes, seed)
        report = bench.run(
            shape, workdir=workdir, http=http, audit_sampling=audit_sampling,
            counterfactuals=counterfactuals, max_audit_backlog=max_audit_backlog,
            duckdb_memory_mb=duckdb_memory_mb,
            note=lambda m: console.print(m, markup=False, highlight=False),
        )  # fmt: skip
    except ValueError as error:
        raise fail(str(error), code=2) from None
    _print_report(report, workers, batch, json_out)


def _print_report(report: dict, workers: int, batch: int, json_out: Path | None) -> None:
    """The report as tables and lines, in the order a reader checks it: the audit's
    cost, the ingest rates, CPU and memory by process, the 30 s samples, storage."""
    from shadow.bench import fleet as bench

    console.print(
        f"fleet G = {workers}, B = {batch}: {report['events']:,} events in "
        f"{report['fleet_seconds']:.0f} s of fleet time; required real-time rate "
        f"{report['required_events_per_s']:,.0f} events/s ({report['arrival_rate_per_s']:.0f} "
        f"requests/s); continuous counterfactuals: {report['counterfactuals']}"
    )
    audit = report["audit"]
    table = Table(title=f"Audit per dispatch once the fleet is {bench.FULL_SHARE:.0%} full (ms)")
    for column in ("what", "dispatches", "P50", "P99", "max", "target"):
        table.add_column(column, justify="left" if column == "what" else "right")
    per_round = ((f"{name} per round", p) for name, p in audit["policy_round_ms"].items())
    rows = [("whole audit", audit["audit_ms"]), *audit["policy_ms"].items(), *per_round]
    for name, p in rows:
        if p is None:
            table.add_row(name, "0", "-", "-", "-", "fleet never full")
            continue
        judged = name in audit["policy_ms"]
        verdict = "" if not judged else (
            "[green]ok" if p["p99"] <= bench.AUDIT_TARGET_P99_MS else "[red]MISSED")  # fmt: skip
        target = "" if not judged else f"P99 <= {bench.AUDIT_TARGET_P99_MS:g} {verdict}"
        table.add_row(name, f"{p['n']:,}", f"{p['p50']:.3f}", f"{p['p99']:.3f}",
                      f"{p['max']:.3f}", target)  # fmt: skip
    console.print(table)
    ingest = Table(title="Ingest with the audit and invariants on")
    for column in ("path", "events/s", "required", "ratio", "RSS MiB end (max)",
                   "MiB/min after 1 min"):  # fmt: skip
        ingest.add_column(column, justify="left" if column == "path" else "right")
    for path in ("file", "http"):
        r = report.get(path)
        if r is None:
            continue
        growth = r["growth_mib_per_min_after_1_min"]
        rss = (
            "-"
            if r["rss_mib_end"] is None
            else f"{r['rss_mib_end']:,.0f} ({r['rss_mib_max']:,.0f})"
        )
        ingest.add_row(path, f"{r['sustained_events_per_s']:,.0f}",
                       f"{r['required_events_per_s']:,.0f}", f"{r['ratio']:.2f}", rss,
                       "-" if growth is None else f"{growth:+.1f}")  # fmt: skip
    console.print(ingest)
    for path in ("file", "http"):
        if report.get(path):
            cpu = ", ".join(f"{role} {us:.1f} us" for role, us in
                            report[path]["cpu_us_per_event"].items())  # fmt: skip
            console.print(f"{path}: CPU per event by process: {cpu or '-'}")
    for path in ("file", "http"):
        if report.get(path):
            growth = ", ".join(
                f"{role} {'-' if mib is None else f'{mib:+.1f}'}"
                for role, mib in report[path]["growth_mib_per_min_by_process"].items()
            )
            console.print(f"{path}: memory growth after 1 min by process, MiB/min (each from "
                          f"60 s or its start): {growth or '-'}")  # fmt: skip
            held = report[path]["held_requests_end"]
            if held:
                rates = report[path]["held_growth_per_min_after_1_min"]
                console.print(f"{path}: requests held at the end (growth a minute after 1 min): "
                              + ", ".join(f"{holder} {count:,} ("
                                          + ("-" if rates.get(holder) is None
                                             else f"{rates[holder]:+,.0f}") + ")"
                                          for holder, count in held.items()))  # fmt: skip
    if report.get("file") and report["file"]["audit_sampling"]:
        console.print(f"file: audit sampling on, {report['file']['audit_skipped']:,} "
                      "dispatches skipped")  # fmt: skip
    for path in ("file", "http"):
        samples = (report.get(path) or {}).get("samples", [])
        if samples:
            console.print(_samples_table(path, samples, bench.SAMPLE_S))
    if "http" in report:
        h = report["http"]
        stored = h["stored"]
        console.print(
            f"http: source {h['behind_schedule_end_s']:.2f} s behind the fleet's clock at the "
            f"end, audit {h['audit_lag_end_s']:.2f} s behind; {h['failed_batches']} failed "
            f"batches; stored once: mismatched {stored['mismatched'] or 'none'}, duplicates "
            f"{stored['duplicates']}, {stored['decisions']:,} decisions; audit sampling "
            f"{'on' if h['audit_sampling'] else 'off'}, {h['audit_skipped']:,.0f} dispatches "
            "skipped"
        )
    console.print(
        f"database: {report['database_bytes'] / 2**20:,.1f} MiB for "
        f"{report['fleet_seconds']:.0f} s of fleet time = {report['gib_per_day']:.1f} GiB per "
        f"day of fleet time at G = {workers}"
    )
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_out}")


def _samples_table(path: str, samples: list[dict], every_s: float) -> Table:
    """One pass's 30 s samples: one table per pass and a column per held count, so that
    it fits 80 columns, a CI log's width, with no number cut."""
    headers = ("fleet s", "wall s", "audit lag", "source lag", "cf win", "cf lag", "RSS MiB",
               "held live", "held done", "held win")  # fmt: skip
    rows = []
    for s in samples:
        cf = s["counterfactual_lag_s"]
        held = [f"{s['held'].get(h, 0) / 1000:.1f}" for h in ("live", "finished", "windows")]
        rows.append((f"{s['fleet_s']:.0f}", f"{s['wall_s']:.1f}", f"{s['audit_lag_s']:.2f}",
                     f"{s['behind_s']:.2f}", f"{s['windows']}",
                     "-" if cf is None else f"{cf:.0f}",
                     f"{sum(s['rss_mib'].values()):,.0f}", *held))  # fmt: skip
    caption = (
        "lag: seconds of fleet time behind the fleet's clock; cf: the counterfactual windows "
        "stored (win) and how far the latest lags; held: requests held, in thousands: live, "
        "finished (done), by the windows"
    )
    return sized_table(f"{path}: every {every_s:.0f} s of fleet time", headers, rows, left=0,
                       box=box.SIMPLE_HEAD, caption=caption)  # fmt: skip
