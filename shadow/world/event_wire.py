"""An event struct in the form the world's emitters hand to their sink.

The tap, the router and the emulated engines build the msgspec structs of
`shadow.events`, so the world speaks the service's vocabulary and nothing else. A sink
(`shadow.connectors.sink.HttpEventSink`) takes a dict and stamps `fleet` (if absent),
`source` and `seq` on it; so an event goes out as `event_to_json` writes it, less every
field left at its default: the envelope fields are the sink's to fill, and an unset
field sent as its default would say nothing the service does not already assume.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from shadow.events import Event, event_to_json


@functools.cache
def _defaults(kind: type[Event]) -> tuple[tuple[str, Any], ...]:
    """(name, default) of every field of `kind` that has one."""
    return tuple(
        (info.name, info.default)
        for info in msgspec.structs.fields(kind)
        if info.default is not msgspec.NODEFAULT
    )


def sink_fields(event: Event) -> dict[str, Any]:
    """The event as a JSON-ready dict (`type` first) without its defaulted fields."""
    data = event_to_json(event)
    for name, default in _defaults(type(event)):
        if name in data and data[name] == default:
            del data[name]
    return data
