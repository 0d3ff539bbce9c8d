"""`shadow serve --demo`: the service plus an emulated world with traffic, so a newcomer
sees live data within seconds. The world (fleet, tap, router, load generator) runs in a
child process, so it has a core of its own; the service scrapes the emulated engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from shadow.replay.workload import StepModel, Workload

if TYPE_CHECKING:
    from shadow.service.ingest.pipeline import Pipeline
    from shadow.world.assembly import WorldAddresses


@dataclass(frozen=True)
class DemoPlan:
    service_url: str
    workers: int
    batch: int
    time_scale: float
    load: float
    fleet: str = "default"
    #: loop the bundled trace through the router (the demo); tests send their own
    traffic: bool = True
    #: stop sending new requests this many seconds after the start (those in flight
    #: finish, the fleet drains); None loops for as long as the demo runs
    traffic_s: float | None = None


def demo_workload(plan: DemoPlan) -> Workload:
    """The bundled trace: the `small` preset, re-timed to the demo fleet's load."""
    from shadow.workloads.synthetic import generate
    from shadow.workloads.traces import retime

    return retime(
        generate("small", seed=0), load=plan.load, workers=plan.workers, batch=plan.batch,
        step_model=StepModel(),
    )  # fmt: skip


def world_main(conn: Connection, plan: DemoPlan) -> None:
    """Child process: run the world and loop the trace until the parent says stop."""
    from shadow.service.workers import exit_with_parent, ignore_stop_signals

    ignore_stop_signals()  # the parent handles Ctrl-C (and SIGTERM) and tells us
    exit_with_parent()
    asyncio.run(_world(conn, plan))


async def _world(conn: Connection, plan: DemoPlan) -> None:
    from shadow.world.assembly import World, WorldOptions
    from shadow.world.loadgen import run_load

    boot = int(time.time())  # restarting the demo on the same database continues it
    world = World(
        plan.service_url,
        WorldOptions(workers=plan.workers, batch=plan.batch, time_scale=plan.time_scale,
                     fleet=plan.fleet, incarnation=boot),
    )  # fmt: skip
    addresses = await world.start()
    conn.send(addresses)
    workload = demo_workload(plan)

    async def traffic() -> None:
        rounds = 0
        started = time.monotonic()
        while True:
            this_round = workload
            if plan.traffic_s is not None:  # the requests due before the stop, then none
                left_s = plan.traffic_s - (time.monotonic() - started)
                due = int(np.searchsorted(workload.ready_s / plan.time_scale, left_s))
                if due <= 0:
                    return
                this_round = workload.head(due)
            await run_load(
                addresses.router, this_round, time_scale=plan.time_scale,
                request_id_prefix=f"demo{boot}-{rounds}",
            )  # fmt: skip
            rounds += 1

    def answer(command: tuple) -> None:
        if command[0] == "kill_worker":
            world.kill_worker(command[1])
            conn.send("killed")
        elif command[0] == "digests":
            conn.send(dict(world.fleet.sent_digests))

    try:
        await follow_commands(conn, traffic() if plan.traffic else None, answer)
    finally:
        await world.stop()


async def follow_commands(
    conn: Connection,
    traffic: Coroutine[Any, Any, None] | None,
    answer: Callable[[tuple], None] | None = None,
) -> None:
    """The world process's side of its pipe to the service: `traffic` runs as a task while
    each command goes to `answer`, until "stop" (polled, so the tasks run meanwhile); the
    traffic is then cancelled and waited for."""
    load = asyncio.create_task(traffic) if traffic is not None else None
    try:
        while True:
            if not conn.poll():
                await asyncio.sleep(0.05)
                continue
            command = conn.recv()
            if command == "stop":
                return
            if answer is not None:
                answer(command)
    finally:
        if load is not None:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)


def abandon_previous_world(pipeline: Pipeline, fleet: str) -> int:
    """A demo started on a database of an earlier demo: that world is gone, and so are
    its requests. Finish them (`abort`) so the new world starts on free slots, the way a
    restarted engine does; returns how many were let go."""
    state = pipeline.fleets.get(fleet)
    if state is None:
        return 0
    from shadow.events import FinishEvent

    mirror = state.mirror
    with pipeline.lock:
        held = [r for w in mirror.order for r in w.active.values()] + list(mirror.pool.values())
        ts = max(mirror.now, time.time())
        events = [
            (
                i,
                FinishEvent(
                    ts=ts,
                    fleet=fleet,
                    source="demo-restart",
                    request_id=r.request_id,
                    output_tokens=max(0, r.generated()),
                    reason="abort",
                ),
            )
            for i, r in enumerate(held)
        ]
    if events:
        pipeline.submit(events)
        pipeline.drain()
    return len(events)


class DemoProcess:
    """The parent's handle on a world process: the emulated one by default, or another
    world's `main(conn, plan)` (the real-vLLM world takes minutes to start and to stop)."""

    def __init__(
        self,
        plan: DemoPlan,
        target: Callable[[Connection, DemoPlan], None] = world_main,
        *,
        label: str = "the demo world",
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(child, plan), daemon=True)
        self.label = label
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s

    def start(self, timeout: float | None = None) -> WorldAddresses:
        self.process.start()
        if not self._conn.poll(self.start_timeout_s if timeout is None else timeout):
            self.stop()
            raise TimeoutError(f"{self.label} did not start")
        try:
            answer = self._conn.recv()
        except EOFError:
            self.stop()
            raise RuntimeError(
                f"{self.label} exited while starting; see the traceback above"
            ) from None
        if isinstance(answer, tuple) and answer[0] == "error":  # a world that says why
            self.stop()
            raise RuntimeError(f"{self.label} did not start: {answer[1]}")
        return answer

    def ask(self, command: tuple, timeout: float = 30.0) -> object:
        """Send a command to the world (`("kill_worker", g)`, `("digests",)`); its answer."""
        self._conn.send(command)
        if not self._conn.poll(timeout):
            raise TimeoutError(f"the demo world did not answer {command[0]}")
        return self._conn.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send("stop")
            self.process.join(self.stop_timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
