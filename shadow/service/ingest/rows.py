"""Events to and from their stored rows (the `events` table's lifecycle columns)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from msgspec.structs import asdict as struct_fields

from shadow.events import EVENT_CLASSES, Event, RouterView


def lifecycle_row(ingest_id: int, event: Any) -> tuple:
    """The `events` row of a lifecycle event (every kind but progress and engine steps)."""
    kind = event.type

    def get(name: str) -> Any:
        return getattr(event, name, None)  # events have slots: only their kind's fields

    view = get("router_view")
    if view is not None:
        view = json.dumps(
            {k: {f: x for f, x in struct_fields(v).items() if x is not None}
             if isinstance(v, RouterView) else v
             for k, v in view.items()},
            separators=(",", ":"),
        )  # fmt: skip
    return (
        ingest_id, event.fleet, event.source, event.seq, kind, event.ts, get("request_id"),
        get("worker"), get("prompt_tokens"), get("prompt_hash"), get("max_tokens"),
        get("policy"), view, get("output_tokens"), get("reason"), get("capacity"),
        get("state"), get("raw_reason"), get("estimated"), get("from_engine"),
    )  # fmt: skip


def stored_event(kind: str, fields: dict[str, Any]) -> Event:
    """A stored row as the event it was (columns of other kinds are left out)."""
    present = {key: value for key, value in fields.items() if value is not None}
    present.pop("type", None)
    if kind == "dispatch" and "router_view" in present:
        present["router_view"] = json.loads(present["router_view"])
    return msgspec.convert(present, EVENT_CLASSES[kind])
