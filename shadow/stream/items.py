"""The applied stream: one frozen struct per kind, what the mirror was fed, in order.

The ingest pipeline builds one item per applied event (from the parsed event struct) and
hands the list to the audit follower, which feeds the same items to its replica of the
mirror (`FleetCore.apply`). Items hold only what a mirror needs, so a batch that crosses
to the audit worker process is small: it crosses as msgpack (`encode_stream`), about half
the cost of pickling the tuples this replaced. `ForgetItem` is not an event: it tells a
replica to forget finished requests at the point of the stream where the owner did.
"""

from __future__ import annotations

import msgspec
from msgspec import Struct

from shadow.events import RouterView


class StreamItem(Struct, frozen=True, gc=False, array_like=True, tag_field="kind"):
    """Fields of every item: the event time and the fleet whose mirror applies it."""

    ts: float
    fleet: str


class WorkerItem(StreamItem, tag="worker"):
    worker: str
    capacity: int
    state: str


class ReadyItem(StreamItem, tag="ready"):
    request_id: str
    prompt_tokens: int
    prompt_hash: str | None


class AuditRequest(Struct, frozen=True, gc=False, array_like=True):
    """A dispatch the follower audits, on its replica frozen just before applying it."""

    ingest_id: int
    policy: str
    router_view: dict[str, RouterView] | None


class DispatchItem(StreamItem, tag="dispatch"):
    request_id: str
    worker: str
    #: None for a dispatch that is not audited (a repeat, or one before the checkpoint)
    audit: AuditRequest | None


class ProgressItem(StreamItem, tag="progress"):
    request_id: str
    generated: int


class FinishItem(StreamItem, tag="finish"):
    request_id: str
    output_tokens: int
    reason: str
    #: the event's `estimated` and `from_engine` (the join of `shadow.stream.join`)
    estimated: bool | None = None
    from_engine: bool | None = None


class EngineStepItem(StreamItem, tag="engine_step"):
    worker: str
    step: int
    running: int
    duration_ms: float
    #: the engine's waiting queue in that step (the plugin sends it; 0 when unknown)
    waiting: int = 0


class ForgetItem(StreamItem, tag="forget"):
    """Requests finished before `before_ts` leave the mirror (`FleetCore.forget`)."""

    before_ts: float


AnyItem = (
    WorkerItem | ReadyItem | DispatchItem | ProgressItem | FinishItem | EngineStepItem | ForgetItem
)

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[AnyItem]).decode


def encode_stream(items: list[StreamItem]) -> bytes:
    """The items as they cross to a worker process."""
    return _encode(items)


def decode_stream(data: bytes) -> list[StreamItem]:
    return _decode(data)
