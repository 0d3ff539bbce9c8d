"""The emulated world around the shadow service: a decode fleet, the SSE tap in front of
it and the incumbent JSQ router in front of that, each a real HTTP server on loopback.

    clients -> router (JSQ) -> tap -> worker g        tap, engines --events--> service
                                                        service --scrapes--> /metrics

`shadow serve --demo` runs one in a child process with a load generator; the end-to-end
tests run one in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import uvicorn

from shadow.connectors.sink import HttpEventSink
from shadow.events import WorkerEvent
from shadow.replay.workload import StepModel
from shadow.world.emulator import EmulatedFleet, QuietServer
from shadow.world.event_wire import sink_fields
from shadow.world.process import free_port
from shadow.world.router import Router
from shadow.world.tap import Listener, TapProxy, listen, world_tap_config


@dataclass(frozen=True)
class WorldOptions:
    workers: int = 4
    batch: int = 16
    time_scale: float = 1.0
    router_policy: str = "jsq-pool"
    progress_interval_s: float = 0.1
    fleet: str = "default"
    step_model: StepModel = field(default_factory=StepModel)
    #: a tag unique to this start (e.g. the boot time): source names carry it and engine
    #: steps are numbered from it, so a restarted world is not mistaken for a replay of the
    #: last one (the service de-duplicates by source seq and by worker step)
    incarnation: int | None = None
    #: the real stream's shapes (EmulatedFleet): a lagging stream's tokens merged into one
    #: chunk, every k-th token ending mid-character as an empty-text chunk; the tap counts
    #: tokens, not chunks, so the world sends what a real vLLM sends. 0 turns splits off.
    merge_outputs: bool = True
    split_utf8_every: int = 5


@dataclass(frozen=True)
class WorldAddresses:
    router: str
    tap: str
    workers: dict[str, str]


class World:
    def __init__(self, service_url: str, options: WorldOptions | None = None) -> None:
        self.options = options or WorldOptions()
        self.service_url = service_url
        o = self.options
        tag = "" if o.incarnation is None else f"-{o.incarnation}"
        self.engine_sink = HttpEventSink(service_url, source=f"engines{tag}", fleet=o.fleet)
        self.tap_sink = HttpEventSink(service_url, source=f"tap{tag}", fleet=o.fleet)
        self.router_sink = HttpEventSink(service_url, source=f"router{tag}", fleet=o.fleet)
        self.fleet = EmulatedFleet(
            o.workers, o.batch, step_model=o.step_model, time_scale=o.time_scale,
            sink=self.engine_sink, merge_outputs=o.merge_outputs,
            split_utf8_every=o.split_utf8_every,
        )  # fmt: skip
        if o.incarnation is not None:
            self.fleet.steps = o.incarnation * 1000  # above every step of an earlier start
        self._servers: list[uvicorn.Server] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.tap: TapProxy | None = None
        self._tap_listener: Listener | None = None
        self.router: Router | None = None
        self.addresses: WorldAddresses | None = None

    async def _serve(self, app: object, lifespan: str = "on") -> str:
        port = free_port()
        # leaves signal handlers alone: the world runs inside the demo's process, which
        # ignores Ctrl-C and is stopped by the service (a handler here made the demo
        # quit first, and the service's shutdown fail)
        server = QuietServer(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=port,
                log_level="warning",
                lifespan=lifespan,
                timeout_keep_alive=120,  # longer than any client idles: no reuse-vs-close race
            )
        )
        self._servers.append(server)
        self._tasks.append(asyncio.create_task(server.serve()))
        while not server.started:
            await asyncio.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    async def start(self) -> WorldAddresses:
        await self.engine_sink.start()
        await self.tap_sink.start()
        await self.router_sink.start()
        await self.fleet.start()
        workers = {str(g): url for g, url in enumerate(self.fleet.worker_urls)}
        config = world_tap_config(
            workers, capacity=self.options.batch, policy=self.options.router_policy,
            progress_interval_s=self.options.progress_interval_s, fleet=self.options.fleet,
        )  # fmt: skip
        self.tap = TapProxy(config, self.tap_sink)
        await self.tap.start()
        self._tap_listener = await listen(self.tap.handler(), "127.0.0.1", 0)
        tap_url = f"http://127.0.0.1:{self._tap_listener.port}"
        self.router = Router(
            list(workers), tap_url, capacity=self.options.batch,
            policy=self.options.router_policy, sink=self.router_sink,
        )  # fmt: skip
        router_url = await self._serve(self.router.app)
        self.addresses = WorldAddresses(router_url, tap_url, workers)
        return self.addresses

    def kill_worker(self, g: int) -> None:
        """Crash engine `g` and say so as the engines' health would: a `worker` down
        event from the engines' source (the tap reports requests, never a worker's
        health)."""
        self.fleet.kill_worker(g)
        down = WorkerEvent(ts=time.time(), worker=str(g), capacity=self.options.batch,
                           state="down")  # fmt: skip
        self.engine_sink.put(sink_fields(down))

    async def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        for task in self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        if self._tap_listener is not None:
            await self._tap_listener.close()
        await self.fleet.stop()
        if self.tap is not None:
            await self.tap.stop()
        await self.router_sink.aclose()
        await self.tap_sink.aclose()
        await self.engine_sink.aclose()
