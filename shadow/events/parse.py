"""NDJSON and JSON-array parsing, and batched reading of event files.

Parsing accepts partially: every bad event becomes an `EventError` naming its position,
line, field and reason, and the valid events of the same batch are kept.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from shadow.events.errors import EventError, _error, _kind
from shadow.events.reference import (
    _FAST_REFUSALS,
    _from_reference,
    _reference_json,
    validate_python,
)
from shadow.events.schema import Event, _fast_json

#: an event line longer than this is rejected unread (its rest skipped)
MAX_LINE_BYTES = 1 << 20

Parsed = tuple[list[tuple[int, Event]], list[EventError]]


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
