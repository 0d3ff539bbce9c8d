import gzip
import json
import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shadow.events import (
    EVENT_TYPES,
    FINISH_REASONS,
    SCHEMA_VERSION,
    DispatchEvent,
    EngineStepEvent,
    EventError,
    FinishEvent,
    ProgressEvent,
    ReadyEvent,
    RouterView,
    WorkerEvent,
    event_to_json,
    iter_file,
    parse_body,
    parse_json_array,
    parse_ndjson,
    validate_json,
    validate_python,
)
from shadow.events.reference import _from_reference, _reference_json
from shadow.events.schema import _fast_json

ONE_OF_EACH = [
    {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 64, "state": "draining"},
    {
        "type": "ready",
        "ts": 1.5,
        "fleet": "prod-eu.1",
        "seq": 7,
        "source": "tap_a",
        "request_id": "r1",
        "prompt_tokens": 4000,
        "prompt_hash": "00ff",
        "max_tokens": 512,
    },
    {
        "type": "dispatch",
        "ts": 1.6,
        "request_id": "r1",
        "worker": "w0",
        "policy": "vllm-dplb",
        "router_view": {"w0": {"running": 3, "waiting": 1}, "w1": {"tokens": 9000}},
    },
    {"type": "progress", "ts": 2.0, "request_id": "r1", "generated": 64, "estimated": True},
    {
        "type": "finish",
        "ts": 3.0,
        "request_id": "r1",
        "output_tokens": 100,
        "reason": "length",
        "raw_reason": "length",
        "estimated": False,
        "from_engine": True,
    },
    {
        "type": "engine_step",
        "ts": 3.0,
        "worker": "w0",
        "step": 12,
        "duration_ms": 61.5,
        "running": 64,
        "kv_tokens": 331000,
        "waiting": 2,
        "tokens": 64,
    },
]
CLASSES = [WorkerEvent, ReadyEvent, DispatchEvent, ProgressEvent, FinishEvent, EngineStepEvent]

GOOD_READY = {"type": "ready", "ts": 1.0, "request_id": "r", "prompt_tokens": 10}


def ndjson(*items: object) -> bytes:
    return b"\n".join(
        item if isinstance(item, bytes) else json.dumps(item).encode() for item in items
    )


def one_error(item: object) -> EventError:
    """Parse [good, item, good]: both good events survive, exactly one error at position 1."""
    events, errors = parse_ndjson(ndjson(GOOD_READY, item, GOOD_READY))
    assert [position for position, _ in events] == [0, 2]
    assert len(errors) == 1
    error = errors[0]
    assert (error.position, error.line) == (1, 2)
    return error


def test_schema_constants():
    assert SCHEMA_VERSION == 1
    assert EVENT_TYPES == ("worker", "ready", "dispatch", "progress", "finish", "engine_step")
    assert {
        "stop", "length", "abort", "error", "cancelled", "tool_calls", "repetition", "recomputed"
    } == FINISH_REASONS  # fmt: skip


@pytest.mark.parametrize("reason", [*sorted(FINISH_REASONS), "content_filter", "a" * 32, "x_9"])
def test_every_reason_word_is_a_finish_kept_as_sent(reason):
    """An engine's new finish reason is kept, never a lost finish (vLLM sends `tool_calls`
    and `repetition`, which a closed list refused)."""
    raw = {"type": "finish", "ts": 1.0, "request_id": "r", "output_tokens": 3, "reason": reason}
    for event in (validate_json(json.dumps(raw)), validate_python(raw)):
        assert isinstance(event, FinishEvent) and event.reason == reason
        assert (event.raw_reason, event.estimated, event.from_engine) == (None, None, None)
    assert "estimated" not in event_to_json(event)


@pytest.mark.parametrize("reason", ["", "Stop", "stop\n", "_x", "9", "a" * 33, "stop it", "é"])
def test_a_reason_that_is_not_a_word_is_refused_by_both(reason):
    raw = {"type": "finish", "ts": 1.0, "request_id": "r", "output_tokens": 3, "reason": reason}
    error = one_error(raw)
    assert error.field == "reason"
    assert "lowercase word" in error.message or "must not be empty" in error.message


@pytest.mark.parametrize("raw", ONE_OF_EACH, ids=[e["type"] for e in ONE_OF_EACH])
def test_every_type_round_trips(raw):
    event = validate_json(json.dumps(raw))
    assert type(event) is CLASSES[EVENT_TYPES.index(raw["type"])]
    dumped = event_to_json(event)
    assert {k: v for k, v in dumped.items() if k not in ("fleet", "source", "policy")} == {
        k: v for k, v in raw.items() if k not in ("fleet", "source", "policy")
    }
    assert validate_python(dumped) == event
    assert validate_json(json.dumps(dumped)) == event
    events, errors = parse_ndjson(json.dumps(dumped))
    assert errors == [] and events == [(0, event)]


def test_defaults_frozen_and_unknown_fields_ignored():
    event = validate_json(
        b'{"type":"progress","ts":0,"request_id":"r","generated":0,"new_field":{"x":1}}'
    )
    assert isinstance(event, ProgressEvent)
    assert (event.fleet, event.source, event.seq, event.ts) == ("default", "default", None, 0.0)
    assert not hasattr(event, "new_field")
    with pytest.raises(AttributeError):
        event.generated = 5  # type: ignore[misc]
    dispatch = validate_python(ONE_OF_EACH[2])
    assert dispatch.router_view["w0"] == RouterView(running=3, waiting=1)
    assert event_to_json(dispatch)["router_view"]["w1"] == {"tokens": 9000}
    assert event_to_json(validate_python(GOOD_READY)) == {
        "type": "ready",
        "ts": 1.0,
        "fleet": "default",
        "source": "default",
        "request_id": "r",
        "prompt_tokens": 10,
    }
    assert next(iter(event_to_json(WorkerEvent(ts=1, worker="w", capacity=2)))) == "type"


def test_ids_normalised_from_int():
    event = validate_json(b'{"type":"dispatch","ts":1,"request_id":17,"worker":-3,"policy":"jsq"}')
    assert (event.request_id, event.worker) == ("17", "-3")
    assert validate_python({**GOOD_READY, "request_id": 5}).request_id == "5"
    for bad in (True, 3.0, None, "", "x" * 257, ["a"]):
        error = one_error({**GOOD_READY, "request_id": bad})
        assert error.field == "request_id"
    assert (
        "string or an integer id, got true" in one_error({**GOOD_READY, "request_id": True}).message
    )
    assert "got 3.0" in one_error({**GOOD_READY, "request_id": 3.0}).message
    assert "must not be empty" in one_error({**GOOD_READY, "request_id": ""}).message
    assert "at most 256" in one_error({**GOOD_READY, "request_id": "x" * 257}).message
    assert validate_python({**GOOD_READY, "request_id": "x" * 256})


@pytest.mark.parametrize("name", ["a", "prod-eu.1_x", "A" * 128, "0"])
def test_fleet_and_source_charset_accepts(name):
    event = validate_python({**GOOD_READY, "fleet": name, "source": name})
    assert event.fleet == event.source == name


@pytest.mark.parametrize("field", ["fleet", "source"])
@pytest.mark.parametrize("name", ["", "a b", "a/b", "é", "A" * 129, "a\n", 5])
def test_fleet_and_source_charset_rejects(field, name):
    error = one_error({**GOOD_READY, field: name})
    assert error.field == field
    assert error.message.startswith(f"field '{field}': must be ")


@pytest.mark.parametrize(
    ("item", "field", "message"),
    [
        (
            {**GOOD_READY, "prompt_tokens": -5},
            "prompt_tokens",
            "field 'prompt_tokens': must be >= 0, got -5",
        ),
        (
            {**GOOD_READY, "prompt_tokens": True},
            "prompt_tokens",
            "field 'prompt_tokens': must be an integer, got true",
        ),
        (
            {**GOOD_READY, "prompt_tokens": "12"},
            "prompt_tokens",
            "field 'prompt_tokens': must be an integer, got '12'",
        ),
        (
            {**GOOD_READY, "prompt_tokens": 1.5},
            "prompt_tokens",
            "field 'prompt_tokens': must be an integer, got 1.5",
        ),
        (
            {**GOOD_READY, "prompt_tokens": None},
            "prompt_tokens",
            "field 'prompt_tokens': must be an integer, got null",
        ),
        (
            {**GOOD_READY, "max_tokens": 0},
            "max_tokens",
            "field 'max_tokens': must be >= 1, got 0",
        ),
        ({**GOOD_READY, "ts": True}, "ts", "field 'ts': must be a number, got true"),
        ({**GOOD_READY, "ts": "1.0"}, "ts", "field 'ts': must be a number, got '1.0'"),
        ({**GOOD_READY, "ts": -0.5}, "ts", "field 'ts': must be >= 0, got -0.5"),
        ({**GOOD_READY, "seq": -1}, "seq", "field 'seq': must be >= 0, got -1"),
        ({**GOOD_READY, "seq": False}, "seq", "field 'seq': must be an integer, got false"),
        (
            {"type": "ready", "ts": 1.0, "prompt_tokens": 3},
            "request_id",
            "missing field 'request_id'",
        ),
        ({"type": "ready", "request_id": "r", "prompt_tokens": 3}, "ts", "missing field 'ts'"),
        (
            {"type": "foo", "ts": 1.0},
            "type",
            "unknown event type 'foo'; expected one of worker, ready, dispatch, progress, "
            "finish, engine_step",
        ),
        ({"type": 5, "ts": 1.0}, "type", "unknown event type 5; expected one of worker,"),
        ({"ts": 1.0, "request_id": "r"}, "type", "missing field 'type'"),
        (
            {"type": "worker", "ts": 0, "worker": "w", "capacity": 0},
            "capacity",
            "field 'capacity': must be >= 1, got 0",
        ),
        (
            {"type": "worker", "ts": 0, "worker": "w", "capacity": 8, "state": "gone"},
            "state",
            "field 'state': must be one of 'up', 'down' or 'draining', got 'gone'",
        ),
        (
            {"type": "finish", "ts": 0, "request_id": "r", "output_tokens": 3, "reason": "OK"},
            "reason",
            "field 'reason': must be a lowercase word: a letter, then up to 31 of a-z, 0-9, '_'",
        ),
        (
            {"type": "finish", "ts": 0, "request_id": "r", "output_tokens": 3, "reason": 7},
            "reason",
            "field 'reason': must be a string, got 7",
        ),
        (
            {
                "type": "finish",
                "ts": 0,
                "request_id": "r",
                "output_tokens": 3,
                "reason": "stop",
                "estimated": "yes",
            },
            "estimated",
            "field 'estimated': must be true or false, got 'yes'",
        ),
        (
            {
                "type": "finish",
                "ts": 0,
                "request_id": "r",
                "output_tokens": 3,
                "reason": "stop",
                "from_engine": 1,
            },
            "from_engine",
            "field 'from_engine': must be true or false, got 1",
        ),
        (
            {
                "type": "finish",
                "ts": 0,
                "request_id": "r",
                "output_tokens": 3,
                "reason": "stop",
                "raw_reason": "",
            },
            "raw_reason",
            "field 'raw_reason': must not be empty",
        ),
        (
            {"type": "progress", "ts": 0, "request_id": "r", "generated": 1, "estimated": 0},
            "estimated",
            "field 'estimated': must be true or false, got 0",
        ),
        (
            {
                "type": "engine_step",
                "ts": 0,
                "worker": "w",
                "step": 1,
                "duration_ms": 2.0,
                "running": 1,
                "tokens": -1,
            },
            "tokens",
            "field 'tokens': must be >= 0, got -1",
        ),
        (
            {"type": "progress", "ts": 0, "request_id": "r", "generated": -1},
            "generated",
            "field 'generated': must be >= 0, got -1",
        ),
        (
            {
                "type": "engine_step",
                "ts": 0,
                "worker": "w",
                "step": 1,
                "duration_ms": -2.0,
                "running": 1,
            },
            "duration_ms",
            "field 'duration_ms': must be >= 0, got -2.0",
        ),
        (
            {
                "type": "engine_step",
                "ts": 0,
                "worker": "w",
                "step": 1,
                "duration_ms": 2.0,
                "running": 1,
                "kv_tokens": 10.5,
            },
            "kv_tokens",
            "field 'kv_tokens': must be an integer, got 10.5",
        ),
        (
            {
                "type": "dispatch",
                "ts": 0,
                "request_id": "r",
                "worker": "w",
                "router_view": {"w1": {"running": -1}},
            },
            "router_view.w1.running",
            "field 'router_view.w1.running': must be >= 0, got -1",
        ),
        (
            {
                "type": "dispatch",
                "ts": 0,
                "request_id": "r",
                "worker": "w",
                "router_view": {"w1": 3},
            },
            "router_view.w1",
            "field 'router_view.w1': must be an object, got a number",
        ),
        (
            {"type": "dispatch", "ts": 0, "request_id": "r", "worker": "w", "router_view": []},
            "router_view",
            "field 'router_view': must be an object, got an array",
        ),
        ([1, 2], None, "event must be a JSON object, got an array"),
        (7, None, "event must be a JSON object, got a number"),
        (b"garbage", None, "not valid JSON: expected value at column 1"),
        (b'{"type": "ready", "ts": 1', None, "not valid JSON: EOF while parsing an object"),
        (b'{"type":"ready","ts":NaN,"request_id":"r","prompt_tokens":1}', "ts", "finite"),
        (b'{"type":"ready","ts":1e999,"request_id":"r","prompt_tokens":1}', "ts", "finite"),
    ],
)
def test_malformed_event_gives_a_clear_error_and_keeps_the_rest(item, field, message):
    error = one_error(item)
    assert error.field == field
    assert message in error.message, error.message
    assert error.describe() == f"event 1 (line 2): {error.message}"


def test_several_problems_in_one_event_are_all_named():
    error = one_error(
        {"type": "worker", "ts": -1, "worker": "w", "capacity": 0, "state": "gone", "fleet": ""}
    )
    assert error.field == "ts"
    for name in ("'ts'", "'fleet'", "'capacity'", "'state'"):
        assert name in error.message


def test_positions_lines_and_blank_lines():
    body = "\n\n" + json.dumps(GOOD_READY) + "\r\n   \n{bad\n" + json.dumps(GOOD_READY) + "\n\n"
    events, errors = parse_ndjson(body, first_line=101)
    assert [position for position, _ in events] == [0, 2]
    assert [(e.position, e.line) for e in errors] == [(1, 105)]
    assert errors[0].describe().startswith("event 1 (line 105): not valid JSON")
    assert parse_ndjson(b"") == ([], [])
    assert parse_ndjson("\n \n\t\n") == ([], [])
    assert len(parse_ndjson(b"\xef\xbb\xbf" + json.dumps(GOOD_READY).encode())[0]) == 1


def test_huge_batch_positions_are_correct():
    n = 50_000
    bad = set(range(0, n, 997))
    lines = []
    for i in range(n):
        if i in bad:
            lines.append(json.dumps({**GOOD_READY, "prompt_tokens": -i - 1}))
        else:
            lines.append(json.dumps({**GOOD_READY, "request_id": f"r{i}", "seq": i}))
        if i % 10 == 0:
            lines.append("")  # blank lines shift line numbers, not positions
    events, errors = parse_ndjson("\n".join(lines))
    assert len(events) + len(errors) == n
    assert [e.position for e in errors] == sorted(bad)
    assert all(event.seq == position for position, event in events)
    assert all(event.request_id == f"r{position}" for position, event in events)
    for error in errors:
        assert lines[error.line - 1] == json.dumps(
            {**GOOD_READY, "prompt_tokens": -error.position - 1}
        )
        assert error.message == (f"field 'prompt_tokens': must be >= 0, got {-error.position - 1}")


def test_json_array_validates_each_element_separately():
    body = json.dumps(
        [
            GOOD_READY,
            "not an object",
            {**GOOD_READY, "prompt_tokens": True},
            {**GOOD_READY, "prompt_tokens": "12"},
            {**GOOD_READY, "request_id": 9},
            None,
            {"type": "nope", "ts": 0},
        ]
    )
    events, errors = parse_json_array(body)
    assert [position for position, _ in events] == [0, 4]
    assert events[1][1].request_id == "9"
    assert [(e.position, e.line, e.field) for e in errors] == [
        (1, None, None),
        (2, None, "prompt_tokens"),
        (3, None, "prompt_tokens"),
        (5, None, None),
        (6, None, "type"),
    ]
    assert errors[0].message == "event must be a JSON object, got a string"
    assert errors[0].describe() == "event 1: event must be a JSON object, got a string"
    assert errors[4].message.startswith("unknown event type 'nope'")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"type": "ready"}', "body must be a JSON array of events, got an object"),
        (b"[1, 2", "body is not valid JSON"),
        (b"42", "body must be a JSON array of events, got a number"),
    ],
)
def test_json_array_body_that_is_not_an_array(body, message):
    events, errors = parse_json_array(body)
    assert events == []
    assert len(errors) == 1
    assert errors[0].position == -1 and errors[0].line is None and errors[0].field is None
    assert errors[0].message.startswith(message)
    assert errors[0].describe().startswith("body: ")


def test_json_array_and_ndjson_agree():
    items = [*ONE_OF_EACH, {**GOOD_READY, "prompt_tokens": True}, {**GOOD_READY, "ts": 1e308}]
    array_events, array_errors = parse_json_array(json.dumps(items))
    line_events, line_errors = parse_ndjson(ndjson(*items))
    assert array_events == line_events
    assert [(e.position, e.field, e.message) for e in array_errors] == [
        (e.position, e.field, e.message) for e in line_errors
    ]


def test_parse_body_picks_the_format():
    array = json.dumps([GOOD_READY, GOOD_READY]).encode()
    lines = ndjson(GOOD_READY, GOOD_READY)
    assert len(parse_body(array)[0]) == 2
    assert len(parse_body(b"  \n" + array)[0]) == 2
    assert len(parse_body(lines)[0]) == 2
    assert len(parse_body(lines, "application/x-ndjson")[0]) == 2
    # A JSON content type with a single object is a (non-array) JSON body: one body error.
    events, errors = parse_body(json.dumps(GOOD_READY).encode(), "application/json; charset=utf-8")
    assert events == [] and errors[0].position == -1


def test_iter_file_batches_count_across_the_file(tmp_path):
    lines = []
    for i in range(25):
        lines.append(json.dumps({**GOOD_READY, "seq": i}) if i % 7 else "{broken")
        if i == 12:
            lines.append("")
    text = "\n".join(lines) + "\n"
    plain = tmp_path / "events.jsonl"
    plain.write_text(text)
    packed = tmp_path / "events.jsonl.gz"
    with gzip.open(packed, "wt") as handle:
        handle.write(text)
    for path in (plain, packed):
        batches = list(iter_file(path, batch_size=4))
        assert len(batches) == 7  # 26 lines in batches of 4
        events = [pair for batch, _ in batches for pair in batch]
        errors = [error for _, batch in batches for error in batch]
        assert [e.position for e in errors] == [0, 7, 14, 21]
        assert [e.line for e in errors] == [1, 8, 16, 23]
        assert all(event.seq == position for position, event in events)
        assert len(events) == 21
        assert parse_ndjson(text)[0] == events
    with pytest.raises(ValueError):
        next(iter_file(plain, batch_size=0))


def test_replay_emitter_output_is_valid():
    from shadow.policies import make_policy
    from shadow.replay import replay
    from shadow.replay.events import iter_events
    from shadow.replay.workload import Workload

    workload = Workload.from_arrays(
        "small", [0.0, 0.01, 0.02, 0.5], [10, 200, 30, 4000], [5, 70, 1, 20], [1, 2, 1, 3]
    )
    result = replay(workload, make_policy("jsq"), workers=2, batch=4)
    raw = list(iter_events(result, workload.prompt_keys, progress_every=16))
    events, errors = parse_ndjson("\n".join(json.dumps(e) for e in raw))
    assert errors == []
    assert len(events) == len(raw)
    for (_, event), original in zip(events, raw, strict=True):
        dumped = event_to_json(event)
        assert dumped["type"] == original["type"]
        for key, value in original.items():
            assert dumped[key] == (str(value) if key in ("worker", "request_id") else value)


# -- the two validators agree -----------------------------------------------------------
# Events are decoded by msgspec and, for what it refuses, by the pydantic reference (which
# words every error). Generated lines near the schema: a valid event of each type with
# some fields swapped for tricky values, dropped, reordered or joined by unknown ones.

_TRICKY = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([2**31 - 1, 2**31, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**64, -(2**63), 2**70]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, 5e-324, 3.0, "@1e999@"]),  # 1e999: infinity in JSON
    st.sampled_from(
        [
            "",
            "a",
            "a\n",
            "\na",
            "a b",
            "x" * 128,
            "x" * 129,
            "x" * 256,
            "x" * 257,
            "é",
            "\ud800",
            "up",
            "stop",
            "1",
            "tool_calls",
            "Stop",
            "stop\n",
            "_stop",
            "9lives",
            "a" * 32,
            "a" * 33,
            "stop-it",
        ]
    ),
    st.text(max_size=6),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.sampled_from(["running", "waiting", "tokens", "x", ""]),
        st.one_of(st.none(), st.integers(-1, 2**64), st.booleans(), st.floats()),
        max_size=3,
    ),
)


@st.composite
def near_schema_lines(draw: st.DrawFn) -> bytes:
    event = dict(draw(st.sampled_from(ONE_OF_EACH)))
    if "router_view" in event and draw(st.booleans()):
        event["router_view"] = {draw(st.sampled_from(["w0", "", "x" * 257])): draw(_TRICKY)}
    for name in draw(st.lists(st.sampled_from([*event, "fleet", "seq", "source"]), max_size=2)):
        if name == "type" and draw(st.booleans()):
            event[name] = draw(st.sampled_from(["nope", 5, None, "Progress"]))
        elif draw(st.integers(0, 4)) == 0:
            event.pop(name, None)
        else:
            event[name] = draw(_TRICKY)
    if draw(st.booleans()):
        event["future_field"] = draw(_TRICKY)
    items = list(event.items())
    draw(st.randoms()).shuffle(items)
    text = json.dumps(dict(items), ensure_ascii=draw(st.booleans())).replace('"@1e999@"', "1e999")
    return text.encode("utf-8", "surrogatepass")  # lone surrogates: invalid UTF-8


@settings(max_examples=3000, deadline=None)
@given(near_schema_lines())
def test_msgspec_and_the_reference_accept_the_same_events(line: bytes):
    try:
        reference = _from_reference(_reference_json(line))
    except ValidationError:
        reference = None
    try:
        event = validate_json(line)
    except ValidationError:
        event = None
    assert event == reference and type(event) is type(reference)
    events, errors = parse_ndjson(line)
    assert events == ([] if reference is None else [(0, reference)])
    assert len(errors) == (reference is None)
    # msgspec alone decides the line unless it is one of the known edges
    try:
        line.decode()
        fast = _fast_json(line)
    except (UnicodeDecodeError, msgspec.MsgspecError):
        fast = None
    if fast is not None:
        assert reference is not None, "msgspec accepted what the reference rejects"
        assert type(fast) is type(reference) and event_to_json(fast) == event_to_json(reference)
    elif reference is not None:
        # msgspec's integers stop at 64 bits (the reference takes such an id, as text), and
        # it rejects the non-standard NaN and Infinity the reference parses (and ignores, in
        # an unknown field): those lines are the reference's to decode
        edge = re.search(rb"\d{19}|NaN|Infinity", line)
        assert edge, "the reference accepted what msgspec rejects"


def test_nesting_past_the_recursion_limit_is_one_bad_line():
    """msgspec raises RecursionError (not its own error) on such a line: it must go to the
    reference and become one error, not fail the batch."""
    deep = b'{"type":"progress","ts":1,"request_id":"r","generated":3,"x":%s}' % (
        b"[" * 5000 + b"]" * 5000
    )
    error = one_error(deep)
    assert error.field is None and "not valid JSON" in error.message
    with pytest.raises(ValidationError):
        validate_json(deep)
