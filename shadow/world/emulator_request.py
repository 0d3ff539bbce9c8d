"""What an emulated engine reads from a completion request: vLLM's fields and the
emulator's own controls.

The controls ride in `vllm_xargs`, the object vLLM 0.32 accepts for custom extensions
(a real server ignores them), so a test or the tap in front passes them through unchanged:

- `emulate_finish_reason`: `stop`, `length`, `abort`, `tool_calls` (chat only) or
  `repetition` (default `length`, as with `ignore_eos`);
- `emulate_stop_reason`: the `stop_reason` sent with the finish (a stop token id, a stop
  string, or vllm-ascend's `"recomputed"`);
- `emulate_output_tokens`: tokens generated before the finish (1..max_tokens; default
  max_tokens);
- `emulate_fail_after`: the engine fails the request after this many tokens (the
  stream ends with an error chunk, a non-streaming request gets a 500).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS = 16
FINISH_REASONS = ("stop", "length", "abort", "tool_calls", "repetition")


class BadRequest(Exception):
    """A request vLLM would refuse with 400; the message names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Ask:
    """One parsed completion request."""

    prompt_tokens: int
    max_tokens: int
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    output_tokens: int
    finish_reason: str
    stop_reason: str | int | None
    fail_after: int | None


def _words(text: str) -> int:
    return len(text.split())


def _int(value: Any, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRequest(f"{name} must be an integer >= {low}, got {value!r}", name)
    if high is not None and value > high:
        raise BadRequest(f"{name} must be <= {high}, got {value}", name)
    return value


def max_tokens(payload: dict[str, Any], chat: bool) -> int:
    value = payload.get("max_tokens")
    if value is None and chat:
        value = payload.get("max_completion_tokens")
    if value is None:
        return DEFAULT_MAX_TOKENS
    return _int(value, "max_tokens", 1)


def prompt_tokens(payload: dict[str, Any], chat: bool) -> int:
    """Token count of the prompt: ids are counted, text is counted in words."""
    if chat:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", "messages")
        words = 0
        for message in messages:
            if not isinstance(message, dict):
                raise BadRequest("each message must be an object", "messages")
            content = message.get("content")
            if isinstance(content, str):
                words += _words(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        words += _words(part["text"])
        return max(1, words)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return max(1, _words(prompt))
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return len(prompt)
    raise BadRequest(
        "prompt must be a string or a non-empty list of token ids (batch of one)", "prompt"
    )


def parse(payload: Any, chat: bool) -> Ask:
    """The request's fields, or `BadRequest` naming the one that is wrong."""
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    limit = max_tokens(payload, chat)
    n = _int(payload.get("n", 1) if payload.get("n") is not None else 1, "n", 1, 128)
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    xargs = payload.get("vllm_xargs") or {}
    if not isinstance(xargs, dict):
        raise BadRequest("vllm_xargs must be an object", "vllm_xargs")
    reason = xargs.get("emulate_finish_reason", "length")
    if reason not in FINISH_REASONS or (reason == "tool_calls" and not chat):
        allowed = [r for r in FINISH_REASONS if chat or r != "tool_calls"]
        raise BadRequest(
            f"vllm_xargs.emulate_finish_reason must be one of {allowed}, got {reason!r}",
            "vllm_xargs.emulate_finish_reason",
        )
    stop_reason = xargs.get("emulate_stop_reason")
    if isinstance(stop_reason, bool) or not isinstance(stop_reason, str | int | None):
        raise BadRequest(
            f"vllm_xargs.emulate_stop_reason must be a string or an integer, got {stop_reason!r}",
            "vllm_xargs.emulate_stop_reason",
        )
    output = xargs.get("emulate_output_tokens", limit)
    output = _int(output, "vllm_xargs.emulate_output_tokens", 1, limit)
    fail_after = xargs.get("emulate_fail_after")
    if fail_after is not None:
        fail_after = _int(fail_after, "vllm_xargs.emulate_fail_after", 1)
    return Ask(
        prompt_tokens=prompt_tokens(payload, chat),
        max_tokens=limit,
        n=n,
        stream=bool(payload.get("stream", False)),
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options and options.get("continuous_usage_stats")),
        output_tokens=output,
        finish_reason=reason,
        stop_reason=stop_reason,
        fail_after=fail_after,
    )


def header(scope: MutableMapping[str, Any], name: bytes) -> str | None:
    """An ASGI request header's value (`name` lower-case), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def pinned_rank(value: str | None, served: list[int]) -> int | None:
    """The data-parallel rank `X-data-parallel-rank` pins (None: not pinned), one of the
    engines `served`; else `BadRequest` worded as vLLM words it."""
    if value is None:
        return None
    try:
        rank = int(value)
    except ValueError:
        raise BadRequest(
            f"X-data-parallel-rank must be an integer, got {value!r}", "X-data-parallel-rank"
        ) from None
    if rank in served:
        return rank
    if len(served) == 1:
        message = f"data_parallel_rank {rank} is not served here (engine {served[0]} is)."
    else:
        message = f"data_parallel_rank {rank} is out of range [0, {len(served)})."
    raise BadRequest(message, "X-data-parallel-rank")
