"""The mirror's records: one request, one worker, what a worker ran in a step, and a
request that left the fleet. Apart from the `FleetMirror` (`shadow.stream.mirror`) that
updates them, so that the mirror's column stores (`finished_ledger`, `ready_columns`)
can name a request without importing the mirror that holds them."""

from __future__ import annotations

from dataclasses import dataclass

from shadow.stream.active_history import ActiveHistory


@dataclass(frozen=True)
class StepView:
    """What a worker ran in one step, by the mirror: requests and their KV tokens."""

    running: int
    kv_tokens: int


class RequestState:
    __slots__ = (
        "dispatch_ts",
        "estimated",
        "finish_ref",
        "finish_ts",
        "finished",
        "last_seen_ts",
        "offset",
        "output_tokens",
        "pool_index",
        "progress",
        "prompt_key",
        "prompt_tokens",
        "ready_ts",
        "reason",
        "request_id",
        "slot",
        "worker",
    )

    def __init__(self, request_id: str, prompt_tokens: int, prompt_key: int, ready_ts: float):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.prompt_key = prompt_key
        self.ready_ts = ready_ts
        self.worker: WorkerState | None = None
        self.offset = 0
        self.progress = 0
        self.dispatch_ts: float | None = None
        self.last_seen_ts = ready_ts
        self.finished = False
        self.output_tokens: int | None = None
        #: the finish's count was the tap's estimate (an exact one may still correct it)
        self.estimated = False
        self.finish_ts: float | None = None
        self.reason: str | None = None
        #: the caller's reference to the finish that finished it (the service's ingest id)
        self.finish_ref = -1
        self.slot = -1
        #: its row in the mirror's `ReadyColumns` while it is in the pool, else -1
        self.pool_index = -1

    def generated(self) -> int:
        worker = self.worker
        return worker.steps - self.offset if worker is not None else self.progress


class WorkerState:
    __slots__ = (
        "active",
        "active_history",
        "capacity",
        "index",
        "last_step",
        "offset_sum",
        "prompt_sum",
        "starting",
        "state",
        "steps",
        "version",
        "worker_id",
    )

    def __init__(self, index: int, worker_id: str, capacity: int, state: str) -> None:
        self.index = index
        self.worker_id = worker_id
        self.capacity = capacity
        self.state = state
        self.steps = 0
        self.last_step = -1
        self.prompt_sum = 0
        self.offset_sum = 0
        self.active: dict[str, RequestState] = {}
        #: recent changes of len(active), for comparing scrapes (`ActiveHistory`)
        self.active_history = ActiveHistory()
        #: dispatched requests not yet seen in a step (a dispatch lands mid-step in a
        #: live fleet: the request first decodes in the next step)
        self.starting: list[RequestState] = []
        #: raised by every change of the worker's active set or their generated counts,
        #: so a reader can tell which workers changed since it last looked
        #: (`stream.projection`)
        self.version = 0

    @property
    def load(self) -> int:
        return self.prompt_sum + len(self.active) * self.steps - self.offset_sum

    @property
    def accepting(self) -> bool:
        return self.state == "up"


@dataclass(frozen=True)
class Completed:
    """A request that left the fleet, with what is known of it."""

    request_id: str
    worker: str | None
    prompt_tokens: int
    output_tokens: int
    reason: str
    ts: float
