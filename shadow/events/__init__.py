"""The event schema of ARCHITECTURE.md ("Events (the tap's vocabulary)").

Two validators of one schema. The events themselves are frozen msgspec structs, decoded
straight from a JSON line by msgspec: about 1 us an event instead of pydantic's 2.2-3.6 us,
and never tracked by the cyclic garbage collector, which matters at tens of thousands of
events a second. A line msgspec refuses goes to the reference validator, pydantic
dataclasses of the same schema, which either accepts it (an edge msgspec is stricter on,
such as an integer id past 64 bits) or says precisely which field is wrong and why; so
every error message comes from one place, and `tests/test_events.py` checks on generated
lines that the two accept the same lines with the same values. Two shapes differ, both
inside an unknown field that msgspec skips unread and the reference parses: nesting past
200 levels and integers past 4,300 digits are accepted here (the field dropped, as every
unknown field is), where the reference would refuse the line.

Parsing accepts partially: every bad event becomes an `EventError` naming its position,
line, field and reason, and the valid events of the same batch are kept. Numbers are
strict (a boolean or a numeric string is not a token count) because a tap that sends
`true` for a count has a bug the operator should see, not a silent 1. Unknown fields are
ignored so that newer emitters can add fields without breaking older services
(`SCHEMA_VERSION` changes only when a field changes meaning).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta, Struct
from msgspec.structs import force_setattr
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import core_schema, from_json

SCHEMA_VERSION = 1

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
NAME_RULE = "1..128 characters of letters, digits, '.', '_', '-'"
ID_MAX = 256
#: The largest count: any sum of a fleet's counts still fits the int64 of DuckDB and numpy.
COUNT_MAX = 2**53 - 1
#: an event line longer than this is rejected unread (its rest skipped)
MAX_LINE_BYTES = 1 << 20


class _IdSchema:
    """Ids may be JSON strings or integers (emitters often number requests); stored as str.

    Built as a pure pydantic-core chain (strict str-or-int, then str with number coercion)
    rather than a Python validator: that keeps an event at about 1.5 us instead of 2.2 us,
    and still rejects booleans and floats (`3.0` must not silently become a new id "3.0").
    """

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.chain_schema(
            [
                core_schema.union_schema(
                    [core_schema.str_schema(strict=True), core_schema.int_schema(strict=True)],
                    custom_error_type="id_type",
                    custom_error_message="must be a string or an integer id",
                ),
                core_schema.str_schema(coerce_numbers_to_str=True, min_length=1, max_length=ID_MAX),
            ]
        )


Id = Annotated[str, _IdSchema()]
Name = Annotated[StrictStr, Field(pattern=NAME_PATTERN)]
Text = Annotated[StrictStr, Field(min_length=1, max_length=ID_MAX)]
Count = Annotated[StrictInt, Field(ge=0, le=COUNT_MAX)]
#: Per-worker counts (running, waiting requests; slot capacity) are stored as 32-bit.
SLOTS_MAX = 2**31 - 1
Slots = Annotated[StrictInt, Field(ge=0, le=SLOTS_MAX)]
Seconds = Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)]


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

    def __post_init__(self) -> None:
        _id_text(self, "request_id")


class FinishEvent(_Event, tag="finish", frozen=True, kw_only=True, gc=False):
    """A request left its worker."""

    type: ClassVar[str] = "finish"
    request_id: _FastId
    output_tokens: _FastCount
    reason: Literal["stop", "length", "abort", "error", "cancelled"]

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

    def __post_init__(self) -> None:
        _id_text(self, "worker")


Event = WorkerEvent | ReadyEvent | DispatchEvent | ProgressEvent | FinishEvent | EngineStepEvent
EVENT_TYPES: tuple[str, ...] = ("worker", "ready", "dispatch", "progress", "finish", "engine_step")
_fast_json = msgspec.json.Decoder(Event).decode


# -- the reference validator: pydantic, every rejection explained --------------------
#: Frozen pydantic dataclasses with slots (validating a line into one costs 1.9 us
#: against 3.0 us for a model). Unknown fields are ignored (forward compatible).
_event = pydantic_dataclass(
    frozen=True, slots=True, kw_only=True, config=ConfigDict(extra="ignore")
)


@_event
class _ReferenceBase:
    """`_Event` as the reference validates it."""

    type: str  # narrowed to a Literal by each event; declared here so it dumps first
    ts: Seconds
    fleet: Name = "default"
    seq: Count | None = None
    source: Name = "default"


@_event
class _ReferenceWorker(_ReferenceBase):
    """`WorkerEvent` as the reference validates it."""

    type: Literal["worker"] = "worker"
    worker: Id
    capacity: Annotated[StrictInt, Field(ge=1, le=SLOTS_MAX)]
    state: Literal["up", "down", "draining"] = "up"


@_event
class _ReferenceReady(_ReferenceBase):
    """`ReadyEvent` as the reference validates it."""

    type: Literal["ready"] = "ready"
    request_id: Id
    prompt_tokens: Count
    prompt_hash: Text | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1, le=COUNT_MAX)] | None = None


class _ReferenceRouterView(BaseModel):
    """`RouterView` as the reference validates it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    running: Count | None = None
    waiting: Count | None = None
    tokens: Count | None = None


@_event
class _ReferenceDispatch(_ReferenceBase):
    """`DispatchEvent` as the reference validates it."""

    type: Literal["dispatch"] = "dispatch"
    request_id: Id
    worker: Id
    policy: Text = "unknown"
    router_view: dict[Text, _ReferenceRouterView] | None = None


@_event
class _ReferenceProgress(_ReferenceBase):
    """`ProgressEvent` as the reference validates it."""

    type: Literal["progress"] = "progress"
    request_id: Id
    generated: Count


@_event
class _ReferenceFinish(_ReferenceBase):
    """`FinishEvent` as the reference validates it."""

    type: Literal["finish"] = "finish"
    request_id: Id
    output_tokens: Count
    reason: Literal["stop", "length", "abort", "error", "cancelled"]


@_event
class _ReferenceEngineStep(_ReferenceBase):
    """`EngineStepEvent` as the reference validates it."""

    type: Literal["engine_step"] = "engine_step"
    worker: Id
    step: Count
    duration_ms: Seconds
    running: Slots
    kv_tokens: Count | None = None
    waiting: Slots | None = None


_ReferenceEvent = Annotated[
    _ReferenceWorker
    | _ReferenceReady
    | _ReferenceDispatch
    | _ReferenceProgress
    | _ReferenceFinish
    | _ReferenceEngineStep,
    Field(discriminator="type"),
]

#: The reference validator (pydantic objects, not events): `validate_json` and
#: `validate_python` below return events.
REFERENCE_ADAPTER: TypeAdapter[Any] = TypeAdapter(_ReferenceEvent)
# pydantic-core's validator itself: `TypeAdapter.validate_json` adds about 5 us of Python
# per call (argument checks, then the same call)
_reference_json = REFERENCE_ADAPTER.validator.validate_json
_reference_python = REFERENCE_ADAPTER.validator.validate_python


#: What sends a line to the reference: msgspec's own errors, a string that is not UTF-8,
#: and nesting deeper than Python's recursion limit (in an unknown field msgspec skips,
#: which the reference rejects past 200 levels).
_FAST_REFUSALS = (msgspec.MsgspecError, UnicodeDecodeError, UnicodeEncodeError, RecursionError)


def _from_reference(checked: Any) -> Event:
    """The event of what only the reference accepted (or the array path checked)."""
    return msgspec.convert(REFERENCE_ADAPTER.dump_python(checked, exclude_none=True), Event)


def validate_json(data: bytes | str) -> Event:
    """One event from one JSON text: msgspec first, the reference for what it refuses
    (pydantic's `ValidationError` then says what is wrong)."""
    try:
        if isinstance(data, bytes) and not data.isascii():
            # msgspec skips an unknown field's string unchecked; the reference rejects the
            # line if that string is not UTF-8
            data.decode()
        return _fast_json(data)
    except _FAST_REFUSALS:
        return _from_reference(_reference_json(data))


def validate_python(data: Any) -> Event:
    """One event from decoded JSON (a dict), by the reference validator."""
    return _from_reference(_reference_python(data))


Parsed = tuple[list[tuple[int, Event]], list["EventError"]]


@dataclass(frozen=True)
class EventError:
    """One rejected event: where it was (position in the batch, line) and why."""

    position: int
    line: int | None
    field: str | None
    message: str

    def describe(self) -> str:
        where = "body" if self.position < 0 else f"event {self.position}"
        if self.line is not None:
            where += f" (line {self.line})"
        return f"{where}: {self.message}"


# ---------------------------------------------------------------------------------------
# Error messages: pydantic's error dicts turned into one line an operator can act on.


def _show(value: Any) -> str:
    """A JSON-ish rendering of an offending input, short enough for a log line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return repr(text)
    return repr(value)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return (
        _show(value) if isinstance(value, (dict, list)) or value is None else type(value).__name__
    )


_AT_LINE = re.compile(r" at line 1 column (\d+)$")


def _json_reason(text: str) -> str:
    """The parser's reason without "line 1" (every NDJSON line is its own line 1)."""
    return _AT_LINE.sub(r" at column \1", str(text)) or "syntax error"


def _reason(err: dict[str, Any]) -> str:
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    got = _show(value)
    if kind == "int_type":
        return f"must be an integer, got {got}"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number, got {got}"
    if kind == "string_type":
        return f"must be a string, got {got}"
    if kind == "finite_number":
        return f"must be a finite number, got {got}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {
            "greater_than_equal": (">=", "ge"),
            "greater_than": (">", "gt"),
            "less_than_equal": ("<=", "le"),
            "less_than": ("<", "lt"),
        }[kind]
        bound = ctx.get(op[1])
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op[0]} {bound}, got {got}"
    if kind == "string_pattern_mismatch":
        return f"must be {NAME_RULE}, got {got}"
    if kind == "string_too_short":
        return f"must not be empty, got {got}"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters, got {len(value)}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {got}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be an object, got {_kind(value)}"
    if kind == "id_type":
        return f"must be a string or an integer id, got {got}"
    return f"{err['msg'][:1].lower()}{err['msg'][1:]}, got {got}"


def _one(err: dict[str, Any]) -> tuple[str | None, str]:
    """(dotted field, message) for one pydantic error of a tagged-union validation."""
    kind = err["type"]
    loc = err["loc"]
    value = err.get("input")
    if kind == "json_invalid":
        return None, f"not valid JSON: {_json_reason((err.get('ctx') or {}).get('error', ''))}"
    if kind == "union_tag_invalid":
        tag = value.get("type") if isinstance(value, dict) else None
        return "type", f"unknown event type {_show(tag)}; expected one of {', '.join(EVENT_TYPES)}"
    if kind == "union_tag_not_found":
        return "type", f"missing field 'type' (one of {', '.join(EVENT_TYPES)})"
    path = loc[1:] if loc and loc[0] in EVENT_TYPES else loc  # drop the union tag
    field = ".".join(str(part) for part in path) or None
    if field is None:
        if kind in ("dict_type", "model_type", "model_attributes_type"):
            return None, f"event must be a JSON object, got {_kind(value)}"
        return None, _reason(err)
    if kind == "missing":
        return field, f"missing field '{field}'"
    return field, f"field '{field}': {_reason(err)}"


def _error(exc: ValidationError, position: int, line: int | None) -> EventError:
    """One EventError per event: the first problem names the field; others are appended."""
    errs = exc.errors(include_url=False)
    field, message = _one(errs[0])
    if len(errs) > 1:
        rest = [_one(e)[1] for e in errs[1:4]]
        more = f" (and {len(errs) - 4} more)" if len(errs) > 4 else ""
        message = f"{message}; also {'; '.join(rest)}{more}"
    return EventError(position, line, field, message)


# ---------------------------------------------------------------------------------------
# Parsers.


def _parse_lines(
    lines: Iterable[bytes], first_line: int, first_position: int
) -> tuple[list[tuple[int, Event]], list[EventError], int]:
    """Validate NDJSON lines one by one (blank lines skipped): (events, errors, next position).

    Per-line decoding of the raw bytes measured fastest: it skips building dicts, and a
    bad line costs only itself (and goes to the reference validator, for its reason).
    """
    events: list[tuple[int, Event]] = []
    errors: list[EventError] = []
    append = events.append
    decode = _fast_json
    position = first_position
    for line_no, raw in enumerate(lines, start=first_line):
        if not raw or raw.isspace():
            continue
        try:
            if not raw.isascii():
                raw.decode()  # see `validate_json`
            append((position, decode(raw)))
        except _FAST_REFUSALS:
            try:
                append((position, _from_reference(_reference_json(raw))))
            except ValidationError as exc:
                errors.append(_error(exc, position, line_no))
        position += 1
    return events, errors, position


def parse_ndjson(body: bytes | str, *, first_line: int = 1) -> Parsed:
    """Parse newline-delimited JSON: ((position, event) pairs, errors), in input order.

    `position` counts non-blank lines from 0; `line` in errors is the 1-based line number
    offset by `first_line - 1` (for bodies that are slices of a larger stream).
    """
    data = body.encode() if isinstance(body, str) else body
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    events, errors, _ = _parse_lines(data.split(b"\n"), first_line, 0)
    return events, errors


def parse_json_array(body: bytes | str) -> Parsed:
    """Parse a JSON array of events, each element validated on its own.

    A whole-array validation would reject everything for one bad element, so the array is
    decoded once (pydantic-core's parser) and each element validated as Python data; the
    strict fields make that accept exactly what the JSON path accepts.
    """
    try:
        items = from_json(body)
    except ValueError as exc:
        return [], [EventError(-1, None, None, f"body is not valid JSON: {exc}")]
    if not isinstance(items, list):
        return [], [
            EventError(-1, None, None, f"body must be a JSON array of events, got {_kind(items)}")
        ]
    events: list[tuple[int, Event]] = []
    errors: list[EventError] = []
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            errors.append(
                EventError(position, None, None, f"event must be a JSON object, got {_kind(item)}")
            )
            continue
        try:
            events.append((position, validate_python(item)))
        except ValidationError as exc:
            errors.append(_error(exc, position, None))
    return events, errors


def parse_body(body: bytes, content_type: str | None = None) -> Parsed:
    """A JSON array if the content type says JSON or the body starts with `[`, else NDJSON."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json" or body.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] == b"[":
        return parse_json_array(body)
    return parse_ndjson(body)


def iter_file(
    path: str | Path, *, batch_size: int = 10_000
) -> Iterator[tuple[list[tuple[int, Event]], list[EventError]]]:
    """Read a JSONL file (gzip if it ends in `.gz`) in batches of `batch_size` lines.

    Positions and line numbers run across the whole file, so an error in the third batch
    still points at the right line.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    path = Path(path)
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        raise ValueError(f"{path} {what}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        line_no = 1
        position = 0
        first = True
        bounded = iter(lambda: _bounded_line(handle), b"")
        while True:
            lines = list(islice(bounded, batch_size))
            if not lines:
                return
            if first and lines[0].startswith(b"\xef\xbb\xbf"):
                lines[0] = lines[0][3:]
            first = False
            events, errors, position = _parse_lines(lines, line_no, position)
            line_no += len(lines)
            yield events, errors


def _bounded_line(handle: Any) -> bytes:
    """The next line, or, for one longer than MAX_LINE_BYTES, a stand-in that fails
    validation (the rest of it is skipped): a file with no newlines cannot fill memory."""
    line = handle.readline(MAX_LINE_BYTES + 1)
    if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
        return line
    while line and not line.endswith(b"\n"):
        line = handle.readline(MAX_LINE_BYTES)
    return b'{"line": "longer than %d bytes"}\n' % MAX_LINE_BYTES


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


# ---------------------------------------------------------------------------------------


def bench_parse(n: int = 200_000, *, batch: int = 10_000) -> float:
    """Events per second of `parse_ndjson` on a realistic mix of replay-emitter shapes.

    The stream arrives as bodies of `batch` lines (an HTTP batch, an `iter_file` batch) and
    each batch's events are dropped after parsing, as a service folding them into state
    does; `batch=n` parses one body and holds every event, which measures the cyclic
    garbage collector as much as parsing (about 40% slower).
    """
    import time

    samples = [
        {"type": "engine_step", "ts": 1.25, "fleet": "default", "seq": 1, "worker": 3,
         "step": 120, "duration_ms": 61.5, "running": 64, "kv_tokens": 331000},
        {"type": "progress", "ts": 1.25, "fleet": "default", "seq": 2, "request_id": "req-17",
         "generated": 128},
        {"type": "ready", "ts": 1.3, "fleet": "default", "seq": 3, "request_id": "req-18",
         "prompt_tokens": 4652, "prompt_hash": "00ff00ff00ff00ff"},
        {"type": "dispatch", "ts": 1.31, "fleet": "default", "seq": 4, "request_id": "req-18",
         "worker": 2, "policy": "jsq"},
        {"type": "finish", "ts": 1.4, "fleet": "default", "seq": 5, "request_id": "req-9",
         "output_tokens": 1052, "reason": "stop"},
    ]  # fmt: skip
    weights = [8, 6, 1, 1, 1]  # engine_step and progress dominate real streams
    mix = [json.dumps(s) for s, w in zip(samples, weights, strict=True) for _ in range(w)]
    lines = [mix[i % len(mix)] for i in range(n)]
    bodies = [("\n".join(lines[i : i + batch]) + "\n").encode() for i in range(0, n, max(batch, 1))]
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        count = 0
        for body in bodies:
            events, errors = parse_ndjson(body)
            count += len(events) + len(errors)
            del events, errors
        best = min(best, time.perf_counter() - start)
        assert count == n
    return n / best


if __name__ == "__main__":
    print(f"parse_ndjson, 10,000-line bodies: {bench_parse():,.0f} events/s")
    print(f"parse_ndjson, one 200,000-line body held: {bench_parse(batch=200_000):,.0f} events/s")
