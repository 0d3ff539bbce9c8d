"""Rejected events: where each was and why, in one line an operator can act on.

Every message is worded from the reference validator's (pydantic's) errors, so a field
refused by either validator is explained the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shadow.events.schema import EVENT_TYPES, NAME_RULE, REASON_PATTERN, REASON_RULE


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
    if kind == "bool_type":
        return f"must be true or false, got {got}"
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
        rule = REASON_RULE if ctx.get("pattern") == REASON_PATTERN else NAME_RULE
        return f"must be {rule}, got {got}"
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
