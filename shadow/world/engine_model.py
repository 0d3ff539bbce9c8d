"""The stepping model of the emulated decode fleet: what the replay engine assumes, run
in real time, with no HTTP (BALANCEROUTE.md, "The setting").

- each worker runs at most `batch` requests and queues the rest FIFO;
- ONE loop steps the whole fleet behind a barrier: before a step, waiting requests are
  admitted into free slots; the step takes `T = step_model.step_ms(max_g L_g) / time_scale`
  with `L_g = sum over running (prompt_tokens + generated)`; then every running request
  generates one token, and those that reached their output length finish and free their
  slots (a request may be told to end early with another finish reason, or to fail);
- after each step every live worker reports an `engine_step` event to the optional sink.

Whoever serves the requests (`shadow.world.emulator`) submits them, waits on them and
releases them; a worker's `meter`, if set, hears what happened on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from shadow.events import EngineStepEvent
from shadow.replay.workload import StepModel
from shadow.world.event_wire import sink_fields

log = logging.getLogger(__name__)

MAX_LAG_S = 0.0008  # the most a step is shortened to make up for late timer wake-ups

# The states of a request: queued, in a slot, finished (all tokens), abandoned by its
# client, lost with its worker, failed inside the engine (an injected fault: the server
# answers with an error, the worker lives on).
WAITING, RUNNING, DONE, CANCELLED, DROPPED, FAILED = range(6)
ENDED = (DONE, CANCELLED, DROPPED, FAILED)


class EventSink(Protocol):
    """What the fleet needs of a sink (`shadow.connectors.sink.HttpEventSink` is one)."""

    def put(self, event: dict[str, Any]) -> None: ...


class WorkerMeter(Protocol):
    """What one worker's metrics hear from the stepping model."""

    def admitted(self, prompt_tokens: int) -> None:
        """A request entered a slot (its prompt counts as prefilled)."""

    def stepped(
        self, produced: int, finished: list[str], itl_samples: int, duration_s: float
    ) -> None:
        """A step ended: tokens made, the finish reason of each request that finished,
        inter-token gaps of `duration_s`."""

    def aborted(self) -> None:
        """A request's client went away before it finished."""


@dataclass(eq=False)
class EngineRequest:
    """One request on one worker; the decode loop advances it, its handler streams it."""

    key: str
    prompt_tokens: int
    max_tokens: int
    worker: int
    generated: int = 0
    state: int = WAITING
    waiter: asyncio.Future[None] | None = None
    #: tokens it generates before it finishes (None: `max_tokens`, as with `ignore_eos`)
    output_tokens: int | None = None
    #: what it finishes with once it has them ("length", "stop", "tool_calls", ...)
    finish_reason: str = "length"
    #: fail inside the engine after this many tokens (an injected fault), if set
    fail_after: int | None = None

    def __post_init__(self) -> None:
        if self.output_tokens is None:
            self.output_tokens = self.max_tokens

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Sleep until the decode loop (or a cancel or kill) changes this request."""
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter

    @property
    def ended(self) -> bool:
        return self.state in ENDED


async def wait_any(requests: list[EngineRequest]) -> None:
    """Sleep until the decode loop changes any of `requests` (the n choices of one HTTP
    request share one future; a wake on one of them ends the wait)."""
    if len(requests) == 1:
        await requests[0].wait()
        return
    waiter = asyncio.get_running_loop().create_future()
    for request in requests:
        request.waiter = waiter
    await waiter


@dataclass(eq=False)
class EngineWorker:
    """One worker's slots and queue."""

    index: int
    running: dict[EngineRequest, None] = field(default_factory=dict)  # insertion-ordered set
    waiting: deque[EngineRequest] = field(default_factory=deque)
    alive: bool = True
    meter: WorkerMeter | None = None

    def load(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self.running)


class SteppingFleet:
    """`workers` decode workers stepped behind one barrier by `run()`.

    `steps` numbers the next step (a restarted world starts it higher); `completed` and
    `cancelled` count requests that finished and requests whose client left.
    """

    def __init__(
        self,
        workers: int,
        batch: int,
        *,
        step_model: StepModel | None = None,
        time_scale: float = 1.0,
        sink: EventSink | None = None,
    ) -> None:
        if workers < 1 or batch < 1:
            raise ValueError("an emulated fleet needs workers >= 1 and batch >= 1")
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.batch = batch
        self.step_model = step_model or StepModel()
        self.time_scale = time_scale
        self.sink = sink
        self.cancelled = 0  # requests whose client went away before they finished
        self.completed = 0
        self.steps = 0
        self._workers = [EngineWorker(g) for g in range(workers)]
        self._arrival = asyncio.Event()
        self._lag_s = 0.0  # how late sleeps wake up, subtracted from the next sleep

    # ----------------------------------------------------------------- accessors

    @property
    def workers(self) -> int:
        return len(self._workers)

    def running(self, g: int) -> int:
        return len(self._workers[g].running)

    def waiting(self, g: int) -> int:
        return len(self._workers[g].waiting)

    def alive(self, g: int) -> bool:
        return self._workers[g].alive

    def load(self, g: int) -> int:
        """`L_g` now: KV tokens of worker g's running requests."""
        return self._workers[g].load()

    def request_keys(self, g: int) -> list[str]:
        """The engine ids of worker g's requests, running then waiting (one per choice)."""
        worker = self._workers[g]
        return [r.key for r in (*worker.running, *worker.waiting)]

    # ----------------------------------------------------------------- requests

    def submit(self, request: EngineRequest) -> None:
        """Queue `request` on its worker; the next step admits it if a slot is free."""
        self._workers[request.worker].waiting.append(request)
        self._arrival.set()

    def release(self, request: EngineRequest) -> None:
        """The handler is done with `request`; if it had not finished, the client left."""
        if request.state not in (WAITING, RUNNING):
            return
        worker = self._workers[request.worker]
        if request.state == RUNNING:
            worker.running.pop(request, None)
        else:
            with contextlib.suppress(ValueError):
                worker.waiting.remove(request)
        request.state = CANCELLED
        request.wake()
        self.cancelled += 1
        if worker.meter is not None:
            worker.meter.aborted()

    def fail_requests(self, g: int) -> int:
        """An injected engine fault on worker `g`: every request it holds fails (its
        server answers with an error, as vLLM does on a generation error); the worker
        lives on and takes new requests. Returns how many failed."""
        worker = self._workers[g]
        failed = [*worker.running, *worker.waiting]
        worker.running.clear()
        worker.waiting.clear()
        for request in failed:
            request.state = FAILED
            request.wake()
        if failed and worker.meter is not None:
            worker.meter.stepped(0, ["error"] * len(failed), 0, 0.0)
        return len(failed)

    def crash(self, g: int) -> bool:
        """Worker `g` dies: its requests are dropped and it is no longer stepped. False if
        it was already dead."""
        worker = self._workers[g]
        if not worker.alive:
            return False
        worker.alive = False
        dropped = [*worker.running, *worker.waiting]
        worker.running.clear()
        worker.waiting.clear()
        for request in dropped:
            request.state = DROPPED
            request.wake()
        return True

    # ----------------------------------------------------------------- decode loop

    async def run(self) -> None:
        """Barrier-synchronised steps of the whole fleet (the replay engine's semantics),
        until cancelled."""
        arrival = self._arrival
        workers = self._workers
        batch = self.batch
        clock = time.perf_counter
        try:
            while True:
                live = [w for w in workers if w.alive]
                for worker in live:
                    running, waiting = worker.running, worker.waiting
                    meter = worker.meter
                    while waiting and len(running) < batch:
                        request = waiting.popleft()
                        request.state = RUNNING
                        running[request] = None
                        if meter is not None:
                            meter.admitted(request.prompt_tokens)
                if not any(w.running for w in live):
                    arrival.clear()
                    if not any(w.waiting for w in live):
                        await arrival.wait()
                    continue
                loads = [w.load() for w in live]
                counts = [len(w.running) for w in live]
                queued = [len(w.waiting) for w in live]
                target_s = self.step_model.step_ms(max(loads)) / self.time_scale / 1000.0
                start = clock()
                planned = max(0.0, target_s - self._lag_s)
                await asyncio.sleep(planned)
                end = clock()
                duration_s = end - start
                # The event loop's timers wake up to 1 ms late (epoll's resolution): learn the
                # mean lateness and sleep that much less, but never more than MAX_LAG_S, so a
                # busy spell does not teach it to cut later steps short.
                late = min(MAX_LAG_S, max(0.0, duration_s - planned))
                self._lag_s = min(0.5 * target_s, 0.9 * self._lag_s + 0.1 * late)
                self._finish_step(live, loads, counts, queued, duration_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("emulated decode loop failed")
            raise

    def _finish_step(
        self,
        live: list[EngineWorker],
        loads: list[int],
        counts: list[int],
        queued: list[int],
        duration_s: float,
    ) -> None:
        """Every running request of a live worker gets one token; finished ones leave."""
        step = self.steps
        self.steps += 1
        now = time.time()
        duration_ms = duration_s * 1000.0
        sink = self.sink
        for worker, load, count, waiting in zip(live, loads, counts, queued, strict=True):
            if not worker.alive:  # killed during the step
                continue
            finished: list[EngineRequest] = []
            reasons: list[str] = []
            produced = 0
            itl_samples = 0
            for request in worker.running:
                if request.generated:
                    itl_samples += 1
                request.generated += 1
                produced += 1
                if request.fail_after is not None and request.generated >= request.fail_after:
                    request.state = FAILED
                    finished.append(request)
                    reasons.append("error")
                elif request.generated >= (request.output_tokens or request.max_tokens):
                    request.state = DONE
                    finished.append(request)
                    reasons.append(request.finish_reason)
                request.wake()
            for request in finished:
                del worker.running[request]
            self.completed += sum(r.state == DONE for r in finished)
            if worker.meter is not None:
                worker.meter.stepped(produced, reasons, itl_samples, duration_s)
            if sink is not None:
                event = EngineStepEvent(
                    ts=now,
                    worker=str(worker.index),
                    step=step,
                    duration_ms=duration_ms,
                    running=count,
                    kv_tokens=load,
                    waiting=waiting,
                )
                sink.put(sink_fields(event))
