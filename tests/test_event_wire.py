"""The world's emitters build event structs; what they hand the sink must be the dicts
they used to write by hand (same fields, same order, defaults left to the sink)."""

from __future__ import annotations

import json

import msgspec

from shadow.events import (
    DispatchEvent,
    EngineStepEvent,
    FinishEvent,
    ProgressEvent,
    ReadyEvent,
    RouterView,
    WorkerEvent,
    validate_json,
)
from shadow.world.event_wire import sink_fields


def wire(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def test_each_kind_goes_out_as_the_hand_written_dict():
    view = msgspec.json.decode(b'{"0":{"running":2},"1":{"running":0}}', type=dict[str, RouterView])
    cases = [
        (
            WorkerEvent(ts=1.5, worker="0", capacity=4),
            {"type": "worker", "ts": 1.5, "worker": "0", "capacity": 4},
        ),
        (
            WorkerEvent(ts=1.5, worker="0", capacity=4, state="down"),
            {"type": "worker", "ts": 1.5, "worker": "0", "capacity": 4, "state": "down"},
        ),
        (
            ReadyEvent(ts=2.0, request_id="r1", prompt_tokens=7, prompt_hash="ab12"),
            {"type": "ready", "ts": 2.0, "request_id": "r1", "prompt_tokens": 7,
             "prompt_hash": "ab12"},
        ),
        (
            DispatchEvent(ts=2.0, request_id="r1", worker="1", policy="jsq", router_view=view),
            {"type": "dispatch", "ts": 2.0, "request_id": "r1", "worker": "1", "policy": "jsq",
             "router_view": {"0": {"running": 2}, "1": {"running": 0}}},
        ),
        (
            DispatchEvent(ts=2.0, request_id="r1", worker="1", policy="rr"),
            {"type": "dispatch", "ts": 2.0, "request_id": "r1", "worker": "1", "policy": "rr"},
        ),
        (
            ProgressEvent(ts=3.0, request_id="r1", generated=5),
            {"type": "progress", "ts": 3.0, "request_id": "r1", "generated": 5},
        ),
        (
            FinishEvent(ts=4.0, request_id="r1", output_tokens=16, reason="length"),
            {"type": "finish", "ts": 4.0, "request_id": "r1", "output_tokens": 16,
             "reason": "length"},
        ),
        (
            EngineStepEvent(ts=5.0, worker="2", step=9, duration_ms=20.5, running=3,
                            kv_tokens=300, waiting=0),
            {"type": "engine_step", "ts": 5.0, "worker": "2", "step": 9, "duration_ms": 20.5,
             "running": 3, "kv_tokens": 300, "waiting": 0},
        ),
    ]  # fmt: skip
    for event, hand_written in cases:
        fields = sink_fields(event)
        assert wire(fields) == wire(hand_written)
        assert validate_json(wire(fields)) == event


def test_the_sink_keeps_the_envelope():
    """`fleet`, `source` and `seq` are left out, so the sink's own values apply."""
    fields = sink_fields(ProgressEvent(ts=1.0, request_id="r", generated=1))
    assert not {"fleet", "source", "seq"} & set(fields)
