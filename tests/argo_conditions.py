"""What Argo Rollouts' `web` metric provider does with an answer, for the parts the
examples in deploy/argo-rollouts use, so a test can judge the real answer as Argo would.

- `{{ args.NAME }}` in strings: replaced by the argument's value (the template's default,
  or the value the Rollout step passes).
- `jsonPath`: Kubernetes JSONPath limited to `{$}` and `{$.a.b}` (dotted field names).
  As in the provider, a string result is kept as a string (`"PASS"`), other values as
  their JSON value.
- `successCondition` / `failureCondition`: expr-lang expressions limited to comparisons of
  `result` with a string or number literal (`==`, `!=`), joined by `&&` / `||` (no
  parentheses). `&&` binds tighter than `||`, as in expr.
- The outcome, as in Argo's `evaluate.EvaluateResult`: the failure condition true ->
  Failed; else the success condition true -> Successful; else, with both conditions given,
  Inconclusive (with only a success condition, Failed).

Anything outside this subset raises ValueError, so an example that grows past it fails
its test instead of being judged wrongly."""

from __future__ import annotations

import json
import re
from typing import Any

_ARG = re.compile(r"\{\{\s*args\.([A-Za-z0-9_.-]+)\s*\}\}")
_PATH = re.compile(r"^\{\$((?:\.[A-Za-z_][A-Za-z0-9_-]*)*)\}$")
_COMPARISON = re.compile(r'^result\s*(==|!=)\s*("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false)$')


def substitute(value: Any, args: dict[str, str]) -> Any:
    """`value` (a string, or lists / mappings of them) with every `{{ args.X }}` replaced."""
    if isinstance(value, str):

        def one(match: re.Match[str]) -> str:
            if match.group(1) not in args:
                raise ValueError(f"unknown argument {match.group(1)!r}")
            return args[match.group(1)]

        return _ARG.sub(one, value)
    if isinstance(value, list):
        return [substitute(v, args) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, args) for k, v in value.items()}
    return value


def json_path(document: Any, path: str) -> Any:
    """The `result` of `jsonPath` on a JSON answer."""
    match = _PATH.match(path.strip())
    if match is None:
        raise ValueError(f"jsonPath {path!r} is outside the supported subset")
    value = document
    for name in filter(None, match.group(1).split(".")):
        if not isinstance(value, dict) or name not in value:
            raise ValueError(f"jsonPath {path!r}: no field {name!r}")
        value = value[name]
    return value


def condition(expression: str, result: Any) -> bool:
    """An expr-lang condition on `result`, in the subset above."""
    return any(
        all(_comparison(part.strip(), result) for part in alternative.split("&&"))
        for alternative in expression.split("||")
    )


def _comparison(text: str, result: Any) -> bool:
    match = _COMPARISON.match(text)
    if match is None:
        raise ValueError(f"condition {text!r} is outside the supported subset")
    operator, literal = match.groups()
    equal = result == json.loads(literal)
    return equal if operator == "==" else not equal


def outcome(metric: dict[str, Any], result: Any) -> str:
    """Successful, Failed or Inconclusive, as Argo rates one measurement."""
    success, failure = metric.get("successCondition"), metric.get("failureCondition")
    if failure and condition(failure, result):
        return "Failed"
    if success and condition(success, result):
        return "Successful"
    if success and failure:
        return "Inconclusive"
    return "Failed" if success else "Successful"
