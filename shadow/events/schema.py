"""The event schema of ARCHITECTURE.md ("Events (the tap's vocabulary)"): the frozen
msgspec structs every event becomes, the kind table and the one order of kinds at equal
times.

The events are decoded straight from a JSON line by msgspec: about 1 us an event instead
of pydantic's 2.2-3.6 us, and never tracked by the cyclic garbage collector, which matters
at tens of thousands of events a second. Numbers are strict (a boolean or a numeric string
is not a token count) because a tap that sends `true` for a count has a bug the operator
should see, not a silent 1. Unknown fields are ignored so that newer emitters can add
fields without breaking older services (`SCHEMA_VERSION` changes only when a field
changes meaning).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta, Struct
from msgspec.structs import force_setattr

SCHEMA_VERSION = 1

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
NAME_RULE = "1..128 characters of letters, digits, '.', '_', '-'"
ID_MAX = 256
#: The largest count: any sum of a fleet's counts still fits the int64 of DuckDB and numpy.
COUNT_MAX = 2**53 - 1

#: Per-worker counts (running, waiting requests; slot capacity) are stored as 32-bit.
SLOTS_MAX = 2**31 - 1

#: A finish reason: any identifier-like word, so that a reason an engine adds (vLLM's
#: `tool_calls`, `repetition`, ...) is kept, never a lost finish; short and lowercase so
#: that what is stored and counted stays a word, not free text.
REASON_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
REASON_RULE = "a lowercase word: a letter, then up to 31 of a-z, 0-9, '_'"
#: The reasons the shadow knows (vLLM's and vllm-ascend's, and the tap's own `cancelled`);
#: any other is kept as sent and counted as `other`. `recomputed` is not a finish: the
#: request goes back to the pool to be dispatched again (vllm-ascend's recompute scheduler).
FINISH_REASONS = frozenset(
    ("stop", "length", "abort", "error", "cancelled", "tool_calls", "repetition", "recomputed")
)


# -- the events: msgspec structs, decoded in one call a line ---------------------------
# The same rules as the reference types below; `\Z` because Python's `$` also matches
# before a final newline, where pydantic's (Rust) regex does not.
_FastName = Annotated[str, Meta(pattern=r"\A[A-Za-z0-9._-]{1,128}\Z")]
_FastText = Annotated[str, Meta(min_length=1, max_length=ID_MAX)]
#: an integer id becomes its decimal text in `__post_init__`
_FastId = _FastText | int
_FastCount = Annotated[int, Meta(ge=0, le=COUNT_MAX)]
_FastSlots = Annotated[int, Meta(ge=0, le=SLOTS_MAX)]
#: finite, as msgspec refuses a number past the float range (1e999) where the reference
#: parses it to infinity and then refuses it
_FastSeconds = Annotated[float, Meta(ge=0)]
_FastReason = Annotated[str, Meta(pattern=r"\A[a-z][a-z0-9_]{0,31}\Z")]


class _Event(Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    """Fields common to every event. `gc=False`: an event holds no cycle, and the
    collector would otherwise scan every event waiting in the reorder window."""

    type: ClassVar[str]
    ts: _FastSeconds
    fleet: _FastName = "default"
    seq: _FastCount | None = None
    source: _FastName = "default"


def _id_text(event: Struct, name: str) -> None:
    value = getattr(event, name)
    if value.__class__ is int:
        force_setattr(event, name, str(value))


class WorkerEvent(_Event, tag="worker", frozen=True, kw_only=True, gc=False):
    """A decode worker joins (`up`), leaves (`down`) or drains."""

    type: ClassVar[str] = "worker"
    worker: _FastId
    capacity: Annotated[int, Meta(ge=1, le=SLOTS_MAX)]
    state: Literal["up", "down", "draining"] = "up"

    def __post_init__(self) -> None:
        _id_text(self, "worker")


class ReadyEvent(_Event, tag="ready", frozen=True, kw_only=True, gc=False):
    """Prefill finished: the request enters the ready pool."""

    type: ClassVar[str] = "ready"
    request_id: _FastId
    prompt_tokens: _FastCount
    prompt_hash: _FastText | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=COUNT_MAX)] | None = None

    def __post_init__(self) -> None:
        _id_text(self, "request_id")


class RouterView(Struct, frozen=True, kw_only=True, gc=False):
    """What the incumbent router believed about one worker when it decided."""

    running: _FastCount | None = None
    waiting: _FastCount | None = None
    tokens: _FastCount | None = None


class DispatchEvent(_Event, tag="dispatch", frozen=True, kw_only=True, gc=False):
    """The incumbent sent a request to a worker (with its view of the fleet, if known)."""

    type: ClassVar[str] = "dispatch"
    request_id: _FastId
    worker: _FastId
    policy: _FastText = "unknown"
    router_view: dict[_FastText, RouterView] | None = None

    def __post_init__(self) -> None:
        _id_text(self, "request_id")
        _id_text(self, "worker")


class ProgressEvent(_Event, tag="progress", frozen=True, kw_only=True, gc=False):
    """Cumulative output tokens so far: repeats and reorders are harmless."""

    type: ClassVar[str] = "progress"
    request_id: _FastId
    generated: _FastCount
    #: True: counted by the tap from chunks (a lower bound); False: exact; None: unsaid
    estimated: bool | None = None

    def __post_init__(self) -> None:
        _id_text(self, "request_id")


class FinishEvent(_Event, tag="finish", frozen=True, kw_only=True, gc=False):
    """A request left its worker (or, with reason `recomputed`, went back to the pool).

    The tap and the engine's stat-logger plugin may both send one for a request: the
    service joins them (the first finishes it, a later exact count corrects an estimate).
    """

    type: ClassVar[str] = "finish"
    request_id: _FastId
    output_tokens: _FastCount
    #: one of FINISH_REASONS, or any other word (kept, counted as `other`)
    reason: _FastReason
    #: what the engine said before the tap mapped it (vLLM's `stop_reason`, say)
    raw_reason: _FastText | None = None
    #: True: `output_tokens` counted by the tap from chunks (a lower bound); False: exact
    estimated: bool | None = None
    #: True: sent by the engine's stat-logger plugin, from the engine's own count
    from_engine: bool | None = None

    def __post_init__(self) -> None:
        _id_text(self, "request_id")


class EngineStepEvent(_Event, tag="engine_step", frozen=True, kw_only=True, gc=False):
    """One decode step of one worker (patched engine or emulator): feeds the step model."""

    type: ClassVar[str] = "engine_step"
    worker: _FastId
    step: _FastCount
    duration_ms: _FastSeconds
    running: _FastSlots
    kv_tokens: _FastCount | None = None
    waiting: _FastSlots | None = None
    #: tokens the worker generated in this iteration (the plugin; vLLM's iteration tokens)
    tokens: _FastCount | None = None

    def __post_init__(self) -> None:
        _id_text(self, "worker")


Event = WorkerEvent | ReadyEvent | DispatchEvent | ProgressEvent | FinishEvent | EngineStepEvent
#: kind -> its struct, for code that builds or dispatches by kind
EVENT_CLASSES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (WorkerEvent, ReadyEvent, DispatchEvent, ProgressEvent, FinishEvent, EngineStepEvent)
}
EVENT_TYPES: tuple[str, ...] = tuple(EVENT_CLASSES)
#: The one order of kinds at equal times: the events of a step that just ended
#: (`engine_step`, `progress`, `finish`) come before arrivals and the dispatches of the
#: next step, and a worker joins before anything is sent to it. The reorder buffer, the
#: stored-event replay at start-up and the replay emitter all sort by it.
EVENT_ORDER: dict[str, int] = {
    "worker": 0, "engine_step": 1, "progress": 2, "finish": 3, "ready": 4, "dispatch": 5,
}  # fmt: skip
#: the kinds that close a decode step (they share its end time): a window is never cut
#: between them
STEP_END_KINDS = frozenset(("engine_step", "progress", "finish"))
_fast_json = msgspec.json.Decoder(Event).decode


def event_to_json(event: Any) -> dict[str, Any]:
    """A JSON-ready dict of an event (None fields left out, `type` first) that parses back
    to an equal one."""
    data = {key: value for key, value in msgspec.to_builtins(event).items() if value is not None}
    if "router_view" in data:
        data["router_view"] = {
            worker: {key: value for key, value in view.items() if value is not None}
            for worker, view in data["router_view"].items()
        }
    return data
