"""`shadow tap`: run the deployable tap in front of real decode engines."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from shadow.cli.shared import console, err_console, fail

if TYPE_CHECKING:
    from shadow.connectors.tap.metrics import TapMetrics

TAP_HELP = """Run the tap: a transparent proxy between your router and the decode
engines. It sends what passes (dispatch, progress, finish) to a shadow service
and never alters or waits on the stream.

Two ways in front of the engines (they mix):

* one listener per engine:
  --engine worker=w0,upstream=http://e0:8000,listen=0.0.0.0:9001
  (point the router at :9001 instead of e0:8000);
* one shared listener, --listen 0.0.0.0:9000, and per engine either
  path_prefix=/w0 (the router calls http://tap:9000/w0/v1/...; the prefix
  is stripped) or header=w0 (requests carrying X-Shadow-Worker: w0; the
  header's name is --route-header).

dp_rank=N sets X-data-parallel-rank: N (workers as ranks of one vLLM
server); capacity=B announces the worker (B slots) at start. The tap adds
X-Request-Id when the client sent none, so a request's id (vLLM's own:
cmpl-<id>-0, chatcmpl-<id>) is known before the first byte. The tap's
metrics (shadow_tap_*) are at /metrics on the shared listener and on
--metrics-listen.

A config file (--config) holds the same as TOML:

    \\[tap]
    service = "http://shadow:8321"
    token_file = "/etc/shadow/ingest.token"
    listen = "0.0.0.0:9000"
    \\[\\[tap.engines]]
    worker = "w0"
    upstream = "http://10.0.0.5:8000"
    path_prefix = "/w0"
    dp_rank = 0
    capacity = 64
"""


def tap(
    service: Annotated[
        str | None, typer.Option(help="The shadow service's URL (events go to /v1/events).")
    ] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="File holding a bearer token with the ingest role.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="TOML file with \\[tap] and \\[\\[tap.engines]].")
    ] = None,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            help="An engine: worker=NAME,upstream=URL and one of listen=HOST:PORT, "
            "path_prefix=/P, header=VALUE; optional dp_rank=N, capacity=B. Repeatable."
        ),
    ] = None,
    listen: Annotated[
        str | None, typer.Option(help="The shared listener HOST:PORT (prefix/header routes).")
    ] = None,
    metrics_listen: Annotated[
        str | None, typer.Option(help="HOST:PORT serving only the tap's /metrics.")
    ] = None,
    route_header: Annotated[
        str | None, typer.Option(help="Header the shared listener matches header= against.")
    ] = None,
    fleet: Annotated[str | None, typer.Option(help="Fleet name in the events.")] = None,
    request_ids: Annotated[
        str | None,
        typer.Option(help="'engine' (vLLM's request id, joins the plugin) or 'header'."),
    ] = None,
    sched_slice_us: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Scheduling slice (us) the relay asks of Linux 6.12+, so that a chunk is "
            "relayed at once rather than after a busy neighbour's slice (~1.4 ms on 2 CPUs); "
            "no larger CPU share. 0: asks nothing (the slice stays as inherited). "
            "[default: 100]",  # tap.scheduling.DEFAULT_SLICE_US; importing it loads the tap
        ),
    ] = None,
) -> None:
    from shadow.connectors.tap.config import (
        TapConfig,
        TapConfigError,
        load_config,
        parse_engine_option,
        read_token,
        validate,
        with_engines,
    )

    try:
        base = load_config(config) if config is not None else TapConfig()
        extra = [parse_engine_option(value, i) for i, value in enumerate(engine or [])]
        settings = with_engines(
            base, extra, service=service, listen=listen, metrics_listen=metrics_listen,
            route_header=route_header, fleet=fleet, request_ids=request_ids,
            token_file=token_file, sched_slice_us=sched_slice_us,
        )  # fmt: skip
        validate(settings)
        read_token(settings.token_file)  # a missing or empty token file fails now, not later
    except TapConfigError as error:
        raise fail(escape(str(error)), code=2) from None
    try:
        _event_loop_run(_run(settings))
    except OSError as error:
        raise fail(escape(str(error))) from None


tap.__doc__ = TAP_HELP


def _event_loop_run(main: Coroutine[Any, Any, None]) -> None:
    """uvloop when installed (uvicorn's standard extra brings it): the tap's cost is event
    loop work per chunk, and uvloop does that work in C."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


async def _run(settings: object) -> None:
    from shadow.connectors.tap.serve import RunningTap
    from shadow.service.interpreter import tune_interpreter

    running = RunningTap(settings)  # type: ignore[arg-type]
    _ask_for_slice(running.config.sched_slice_us, running.proxy.metrics)  # before /metrics
    await running.start()
    for name, url in running.addresses.items():
        console.print(f"tap listener {name}: {url}")
    tune_interpreter(TAP_YOUNG_THRESHOLD)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    serving = asyncio.ensure_future(running.serve_forever())
    await asyncio.wait((serving, asyncio.ensure_future(stop.wait())),
                       return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    await running.stop()


def _ask_for_slice(microseconds: int, metrics: TapMetrics) -> None:
    """This thread (the event loop's, which relays every chunk) asks for short scheduling
    slices (`tap.scheduling`); the tap reports the slice in force, and why when it is not
    the one asked for. It runs either way."""
    from shadow.connectors.tap.scheduling import request_slice

    outcome = request_slice(microseconds)
    metrics.set_sched_slice(outcome.slice_us)
    if outcome.problem is not None:
        err_console.print(f"tap scheduling slice: not {microseconds} us: "
                          f"{escape(outcome.problem)}")  # fmt: skip
    elif microseconds and outcome.slice_us is not None:
        console.print(f"tap scheduling slice: {outcome.slice_us:g} us")


#: net allocations between young collections in the tap: each chunk allocates a few
#: short-lived objects (its bytes, the decoded event, an update), nearly all freed by
#: reference counting, so the default 700 ran a collection every few dozen chunks; the
#: collector was 6% of a busy tap's samples (py-spy --native, 1,000 chunks/s)
TAP_YOUNG_THRESHOLD = 50_000
