"""The reference validator: pydantic dataclasses of the same schema as `schema`'s structs.

A line msgspec refuses goes here, which either accepts it (an edge msgspec is stricter on,
such as an integer id past 64 bits) or says precisely which field is wrong and why; so
every error message comes from one place, and `tests/test_events.py` checks on generated
lines that the two accept the same lines with the same values. Two shapes differ, both
inside an unknown field that msgspec skips unread and the reference parses: nesting past
200 levels and integers past 4,300 digits are accepted by msgspec (the field dropped, as
every unknown field is), where the reference would refuse the line.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import core_schema

from shadow.events.schema import (
    COUNT_MAX,
    ID_MAX,
    NAME_PATTERN,
    REASON_PATTERN,
    SLOTS_MAX,
    Event,
    _fast_json,
)


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
Slots = Annotated[StrictInt, Field(ge=0, le=SLOTS_MAX)]
Seconds = Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)]
Reason = Annotated[StrictStr, Field(pattern=REASON_PATTERN)]


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
    estimated: StrictBool | None = None


@_event
class _ReferenceFinish(_ReferenceBase):
    """`FinishEvent` as the reference validates it."""

    type: Literal["finish"] = "finish"
    request_id: Id
    output_tokens: Count
    reason: Reason
    raw_reason: Text | None = None
    estimated: StrictBool | None = None
    from_engine: StrictBool | None = None


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
    tokens: Count | None = None


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
