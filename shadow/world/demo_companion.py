"""The demo world as the service's companion (`shadow serve --demo`): the service starts
and stops it through `shadow.service.http.companion.Companion` and never imports the world
itself. `demo_world` picks which: the emulator (the default, nothing to install) or real
vLLM (`shadow.world.real_vllm`: 2 engines as the ranks of one DP=2 server, the incumbent
router, `shadow tap`, the plugin)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from shadow.world.demo import DemoPlan, DemoProcess, abandon_previous_world, follow_commands

if TYPE_CHECKING:
    from shadow.replay.workload import Workload
    from shadow.service.ingest.pipeline import Pipeline
    from shadow.service.settings import ServiceSettings
    from shadow.world.assembly import WorldAddresses
    from shadow.world.real_vllm import RealWorld

#: the real world's demo: its ranks and the bounds of its traffic (the tiny model streams
#: ~600 tokens/s on 2 cores; longer prompts than the model's 4,096 would be refused)
REAL_WORKERS = 2
REAL_MAX_PROMPT = 2000
REAL_MAX_OUTPUT = 256


class DemoCompanion:
    """Runs the demo world in its child process for the service's lifetime."""

    def __init__(self, plan: DemoPlan, world: str = "emulator") -> None:
        if world not in ("emulator", "vllm"):
            raise ValueError(f"demo_world must be 'emulator' or 'vllm', got {world!r}")
        self.plan = plan
        self.world = world
        self._process: DemoProcess | None = None

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> DemoCompanion:
        """The plan from the service's settings: the one place the demo reads them."""
        host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
        workers = REAL_WORKERS if settings.demo_world == "vllm" else settings.demo_workers
        return cls(
            DemoPlan(
                f"http://{host}:{settings.port}", workers, settings.demo_batch,
                settings.demo_time_scale, settings.demo_load, settings.fleet,
                traffic_s=settings.demo_traffic_s,
            ),
            settings.demo_world,
        )  # fmt: skip

    def start(self, pipeline: Pipeline) -> WorldAddresses:
        """Let go of an earlier demo's requests, then start the world; its addresses."""
        abandon_previous_world(pipeline, self.plan.fleet)
        self._process = (
            DemoProcess(
                self.plan,
                real_world_main,
                label="the real-vLLM demo world",
                start_timeout_s=600.0,
                stop_timeout_s=60.0,
            )
            if self.world == "vllm"
            else DemoProcess(self.plan)
        )
        return self._process.start()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()


def real_workload(plan: DemoPlan) -> Workload:
    """The bundled trace, re-timed to the plan, with prompts and outputs the tiny model's
    context and speed allow."""
    import numpy as np

    from shadow.replay.workload import Workload
    from shadow.world.demo import demo_workload

    base = demo_workload(plan)
    return Workload.from_arrays(
        "demo-vllm",
        np.asarray(base.ready_s),
        np.clip(np.asarray(base.prompt_tokens), 1, REAL_MAX_PROMPT),
        np.clip(np.asarray(base.output_tokens), 1, REAL_MAX_OUTPUT),
    )


def real_world_main(conn: Connection, plan: DemoPlan) -> None:
    """Child process: run the real-vLLM world and loop traffic until told to stop."""
    from shadow.service.workers import exit_with_parent, ignore_stop_signals

    started: list[RealWorld] = []
    workdir = Path(tempfile.mkdtemp(prefix="shadow-demo-vllm-"))

    def cleanup() -> None:  # the engines, tap and model directory, whatever ends this
        for world in started:
            world.stop_processes()
        shutil.rmtree(workdir, ignore_errors=True)

    ignore_stop_signals()
    exit_with_parent(cleanup)
    try:
        asyncio.run(_real_world(conn, plan, workdir, started))
    finally:
        cleanup()


async def _real_world(
    conn: Connection, plan: DemoPlan, workdir: Path, started: list[RealWorld]
) -> None:
    from shadow.world.loadgen import run_load
    from shadow.world.real_vllm import SERVED_MODEL, RealWorld, RealWorldOptions, ServerSpec

    boot = int(time.time())
    options = RealWorldOptions(
        servers=(ServerSpec(dp=plan.workers),), capacity=plan.batch, fleet=plan.fleet,
        incarnation=boot,
    )  # fmt: skip
    try:
        world = RealWorld(plan.service_url, workdir, options)
        started.append(world)
        await asyncio.to_thread(world.start)
        addresses = await world.serve_router()
    except Exception as error:
        conn.send(("error", f"{type(error).__name__}: {error}"))
        return
    conn.send(addresses)
    workload = real_workload(plan)

    async def traffic() -> None:
        rounds = 0
        while True:
            await run_load(
                addresses.router, workload, time_scale=plan.time_scale, model=SERVED_MODEL,
                request_id_prefix=f"demo{boot}-{rounds}", max_in_flight=plan.workers * plan.batch,
            )  # fmt: skip
            rounds += 1

    try:
        await follow_commands(conn, traffic() if plan.traffic else None)
    finally:
        await world.stop_router()
        await asyncio.to_thread(world.stop_processes)
