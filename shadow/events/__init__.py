"""The wire contract: the event structs (`schema`), the reference validator that words
every rejection (`reference`, `errors`) and NDJSON parsing (`parse`).

Two validators of one schema: msgspec decodes a line into a frozen struct; a line it
refuses goes to the pydantic reference, which accepts it or says which field is wrong and
why. Every public name is importable from here.
"""

from shadow.events.errors import EventError
from shadow.events.parse import (
    MAX_LINE_BYTES,
    Parsed,
    iter_file,
    parse_body,
    parse_json_array,
    parse_ndjson,
)
from shadow.events.reference import REFERENCE_ADAPTER, validate_json, validate_python
from shadow.events.schema import (
    COUNT_MAX,
    EVENT_CLASSES,
    EVENT_ORDER,
    EVENT_TYPES,
    FINISH_REASONS,
    ID_MAX,
    NAME_PATTERN,
    NAME_RULE,
    REASON_PATTERN,
    REASON_RULE,
    SCHEMA_VERSION,
    SLOTS_MAX,
    STEP_END_KINDS,
    DispatchEvent,
    EngineStepEvent,
    Event,
    FinishEvent,
    ProgressEvent,
    ReadyEvent,
    RouterView,
    WorkerEvent,
    event_to_json,
)

__all__ = [
    "COUNT_MAX",
    "EVENT_CLASSES",
    "EVENT_ORDER",
    "EVENT_TYPES",
    "FINISH_REASONS",
    "ID_MAX",
    "MAX_LINE_BYTES",
    "NAME_PATTERN",
    "NAME_RULE",
    "REASON_PATTERN",
    "REASON_RULE",
    "REFERENCE_ADAPTER",
    "SCHEMA_VERSION",
    "SLOTS_MAX",
    "STEP_END_KINDS",
    "DispatchEvent",
    "EngineStepEvent",
    "Event",
    "EventError",
    "FinishEvent",
    "Parsed",
    "ProgressEvent",
    "ReadyEvent",
    "RouterView",
    "WorkerEvent",
    "event_to_json",
    "iter_file",
    "parse_body",
    "parse_json_array",
    "parse_ndjson",
    "validate_json",
    "validate_python",
]
