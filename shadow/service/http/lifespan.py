"""What runs beside the handlers for the service's lifetime: the runtime, the mode store
and the live router, the Prometheus registry, the engine poller, the companion (the demo
world) and the idle flush; and the window judge that feeds replayed windows to the modes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CollectorRegistry

from shadow.connectors.poller import MetricsPoller, Target
from shadow.modes import Mode, ModeStore, observe_window
from shadow.service.http.ingest import flush_reorder_window
from shadow.service.http.routing import LiveRouter
from shadow.service.http.state import AppState, Started
from shadow.service.ingest.pipeline import FleetState
from shadow.service.metrics import ServiceCollector, route_latency
from shadow.service.runtime import Runtime
from shadow.storage.queries import decision_latency_p99


def judge_window(runtime: Runtime, modes: ModeStore, fleet_state: FleetState, result) -> None:
    """Feed a replayed window to the fleet's mode: trips on K of M bad windows in `live`,
    recovery after R healthy ones in `fallback` (judged with the policy in shadow)."""
    mode = modes.get(fleet_state.fleet)
    if mode.mode not in (Mode.LIVE, Mode.FALLBACK) or not mode.policy:
        return
    incumbent = result.metrics.get(fleet_state.incumbent, {})
    judged = result.metrics.get("observed" if mode.mode == Mode.LIVE else mode.policy, {})
    worse = False
    if incumbent.get("imbalance_mean") and judged.get("imbalance_mean") is not None:
        worse = judged["imbalance_mean"] > incumbent["imbalance_mean"] * 1.05
    latency = decision_latency_p99(
        runtime.store, fleet_state.fleet, mode.policy, result.t_start, result.t_end
    )
    over = latency is not None and latency > runtime.settings.route_budget_ms
    modes.apply(
        fleet_state.fleet, observe_window, actor="windows", requests=result.requests,
        latency_over_budget=over, imbalance_worse=worse, cfg=runtime.settings.mode_config(),
    )  # fmt: skip


async def _idle_flush(state: AppState) -> None:
    """Apply what the reorder window holds once the stream goes quiet."""
    settings = state.settings
    while True:
        await asyncio.sleep(settings.idle_flush_s / 2)
        runtime = state.runtime
        quiet = time.monotonic() - state.last_submit > settings.idle_flush_s
        if quiet and not runtime.pipeline.broken:
            await run_in_threadpool(flush_reorder_window, runtime, True)


def _start(state: AppState, runtime: Runtime) -> Started:
    settings = state.settings
    modes = ModeStore(runtime.store.engine)
    router = LiveRouter(
        runtime.pipeline, modes, budget_ms=settings.route_budget_ms, stale=state.fleet_stale,
        mode_config=settings.mode_config(),
    )  # fmt: skip
    runtime.pipeline.on_window = lambda fleet_state, result: judge_window(
        runtime, modes, fleet_state, result
    )
    registry = CollectorRegistry()
    started = Started(runtime, modes, router, registry)
    registry.register(
        ServiceCollector(
            lambda: started.runtime,
            lambda: started.modes,
            lambda: started.poller.status() if started.poller else {},
            lambda: state.auth_denied,
            lambda: state.ingest_disconnects,
        )
    )
    router.latency = route_latency(registry)
    return started


def lifespan(state: AppState) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan over `state`: starts everything before the first request, and
    stops it (the poller, the companion, then the runtime) after the last."""

    @contextlib.asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        settings = state.settings
        runtime = await run_in_threadpool(Runtime, settings)
        await run_in_threadpool(runtime.start_workers)
        started = state.started = _start(state, runtime)
        app.state.runtime = runtime
        app.state.router = started.router
        flusher = asyncio.create_task(_idle_flush(state))
        companion = None
        poller = None
        try:
            targets = [Target(e.worker, e.url, e.engine) for e in settings.engines]
            if state.companion is not None:
                companion = state.companion
                addresses = await run_in_threadpool(companion.start, runtime.pipeline)
                started.companion = addresses
                targets += [Target(w, url) for w, url in addresses.workers.items()]
            if targets:
                poller = MetricsPoller(
                    targets,
                    interval_s=settings.poll_interval_s,
                    staleness_s=settings.staleness_s,
                    on_sample=lambda worker, ts, sample: runtime.pipeline.record_engine_sample(
                        settings.fleet, worker, ts, sample
                    ),
                )
                await poller.start()
                started.poller = poller
            yield
        finally:
            flusher.cancel()
            if poller is not None:
                await poller.stop()
            if companion is not None:
                await run_in_threadpool(companion.stop)
            await run_in_threadpool(runtime.close)

    return run
