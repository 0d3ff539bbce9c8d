"""The applied stream's items: one struct per kind, the same after crossing to a worker
process, applied by `FleetCore.apply` as the per-kind methods apply them."""

from __future__ import annotations

import pickle

from shadow.events import EVENT_CLASSES, EVENT_ORDER, EVENT_TYPES, RouterView
from shadow.service.ingest.rows import lifecycle_row, stored_event
from shadow.service.store import LIFECYCLE_COLUMNS
from shadow.stream.fleet import FleetCore
from shadow.stream.items import (
    AuditRequest,
    DispatchItem,
    EngineStepItem,
    FinishItem,
    ForgetItem,
    ProgressItem,
    ReadyItem,
    WorkerItem,
    decode_stream,
    encode_stream,
)

STREAM = [
    WorkerItem(0.0, "f", "w0", 2, "up"),
    ReadyItem(1.0, "f", "a", 10, "00ff"),
    DispatchItem(2.0, "f", "a", "w0", AuditRequest(7, "jsq", {"w0": RouterView(running=1)})),
    EngineStepItem(2.5, "f", "w0", 0, 1, 50.0),
    ProgressItem(2.5, "f", "a", 1),
    FinishItem(3.0, "f", "a", 5, "stop"),
    ForgetItem(50.0, "f", 40.0),
]


def test_one_kind_table_and_one_order() -> None:
    assert tuple(EVENT_CLASSES) == EVENT_TYPES
    assert set(EVENT_ORDER) == set(EVENT_TYPES)


def test_items_cross_a_process_boundary_unchanged() -> None:
    assert decode_stream(encode_stream(STREAM)) == STREAM
    assert pickle.loads(pickle.dumps(STREAM)) == STREAM


def test_apply_is_the_per_kind_methods() -> None:
    by_items, by_calls = FleetCore("f"), FleetCore("f")
    for item in STREAM:
        by_items.apply(item)
    by_calls.worker(0.0, "w0", 2, "up")
    by_calls.ready(1.0, "a", 10, "00ff")
    by_calls.dispatch(2.0, "a", "w0")
    by_calls.engine_step(2.5, "w0", 0, 1, 50.0)
    by_calls.progress(2.5, "a", 1)
    by_calls.finish(3.0, "a", 5, "stop")
    by_calls.forget(40.0)
    assert by_items.mirror.snapshot().load.tolist() == by_calls.mirror.snapshot().load.tolist()
    assert len(by_items.mirror.requests) == len(by_calls.mirror.requests) == 0
    assert "a" not in by_items.mirror.requests and "a" not in by_calls.mirror.requests
    assert by_items.mirror.forgotten_before == by_calls.mirror.forgotten_before == 40.0


def test_a_stored_dispatch_is_the_event_it_was() -> None:
    event = EVENT_CLASSES["dispatch"](
        ts=2.0, seq=3, request_id="a", worker="w0", policy="jsq",
        router_view={"w0": RouterView(running=1, tokens=9)},
    )  # fmt: skip
    fields = dict(zip(LIFECYCLE_COLUMNS, lifecycle_row(1, event), strict=True))
    assert stored_event("dispatch", fields) == event
