"""`shadow serve` and `shadow ingest`: the service, and a recorded event log through its
ingest path."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Annotated

import typer

from shadow.cli.shared import console, err_console, fail


def _settings(config: Path | None, **overrides: object):
    from shadow.service.settings import load_settings

    try:
        return load_settings(config, **overrides)
    except ValueError as error:
        raise fail(str(error), code=2) from None


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
    demo_world: Annotated[
        str | None,
        typer.Option(
            "--demo-world",
            help="What --demo runs: 'emulator' (default) or 'vllm' (real vLLM servers of a "
            "tiny model, `shadow tap` and the plugin; needs the [vllm] extra or "
            "SHADOW_VLLM_PYTHON).",
        ),
    ] = None,
) -> None:
    """Run the shadow service: ingest, mirror, audit, invariants, windows, JSON API."""
    from shadow.service.footprint import limit_heap_arenas

    limit_heap_arenas()  # before any thread: uvicorn's, the commits', DuckDB's
    from shadow.service.http.app import create_app
    from shadow.service.http.server import ServiceServer
    from shadow.service.interpreter import tune_interpreter
    from shadow.service.runtime import DatabaseBusy, ensure_database_free

    settings = _settings(config, host=host, port=port, db=db, demo_world=demo_world)
    try:
        ensure_database_free(settings.db)
    except DatabaseBusy as error:
        raise fail(str(error)) from None
    listener = _listen(settings.host, settings.port)
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
    if demo and settings.demo_world == "vllm":
        from shadow.world.real_vllm import VllmUnavailable, require_vllm_python

        try:
            require_vllm_python()
        except VllmUnavailable as error:
            raise fail(str(error), code=2) from None
        console.print(
            f"  demo: 2 real vLLM engines (one DP=2 server of a tiny model, the plugin "
            f"loaded) behind a JSQ router and `shadow tap`, with traffic; starts in about a "
            f"minute; live mirror at {url}/v1/fleets/{settings.fleet}/snapshot, router "
            f"address at {url}/v1/demo"
        )
    elif demo:
        console.print(
            f"  demo: {settings.demo_workers} emulated decode workers behind a JSQ router and "
            f"the SSE tap, with traffic; live mirror at {url}/v1/fleets/{settings.fleet}/snapshot"
            f", decisions at {url}/v1/fleets/{settings.fleet}/decisions, router address at "
            f"{url}/v1/demo"
        )
    console.print("  Ctrl-C stops everything")
    from shadow.service.heaptrace import start_heap_trace
    from shadow.world.demo_companion import DemoCompanion

    service = create_app(settings, DemoCompanion.from_settings(settings) if demo else None)
    tune_interpreter()
    start_heap_trace("server")
    server = ServiceServer(service, announce=err_console.print)
    with contextlib.suppress(KeyboardInterrupt):  # as `uvicorn.run`: the server re-raises
        server.run(sockets=[listener])  # the Ctrl-C it stopped on
    if not server.started:
        raise typer.Exit(3)  # uvicorn's startup failure; it logged why


def _listen(host: str, port: int) -> socket.socket:
    """The service's port, taken before anything else starts. Uvicorn binds only after the
    lifespan, and the lifespan starts the demo world: a real vLLM opens dozens of sockets
    in that minute, and one of them can land on the port (seen in CI). A port already
    taken is a clear error before anything has started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise fail(f"cannot listen on {host}:{port}: {error.strerror}", code=2) from None
    return listener


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
    try:
        runtime.start_ingesting()
    except RuntimeError as error:
        runtime.close()
        raise fail(escape(str(error))) from None
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
