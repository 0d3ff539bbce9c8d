"""The bytes vLLM 0.32's OpenAI server writes, field for field, for the emulated engines.

Every shape here was read off a real vLLM 0.32 server (the CPU build serving the tiny
model of `shadow.world.tiny_model`): key order, the null fields pydantic writes, the
compact separators of `model_dump_json` and the spaced ones of the `json.dumps` that
writes a mid-stream error. The tap and the accounting are tested against these bytes, so
a field out of place here is a blind spot there.

Token text is synthetic: token j of a choice reads `" tok<j>"`. Two real effects are
modelled: a token that ends inside a UTF-8 character streams as `""` (vLLM's incremental
detokenizer holds it back) and the next token brings its text, and the token that stops
a request (EOS or a stop token) has no text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

DONE_LINE = b"data: [DONE]\n\n"
#: what a held-back token's character is, once the next token completes it
HELD_CHAR = "\u00e9"
TOOL_NAME = "emulated_tool"


def dumps(value: Any) -> bytes:
    """Compact JSON, the way vLLM's pydantic models serialise."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


STOP_REASONS = ("stop", "tool_calls", "repetition")  # end on a token that is not output


def token_text(j: int, count: int, split_utf8_every: int, finish_reason: str) -> str:
    """The text token `j` of a choice of `count` tokens streams (joined over j < count:
    the whole output).

    With `split_utf8_every = k >= 2`, every k-th token ends mid-character: it streams `""`
    and the token after it carries its text too. A request that stops (not `length`) ends
    on a stop token with no text of its own.
    """
    if j == count - 1 and finish_reason in STOP_REASONS:
        return ""
    text = f" tok{j}"
    k = split_utf8_every
    if k:
        if j % k == k - 1 and j < count - 1:
            return ""  # held back: the next token completes its character
        if j and j % k == 0:
            text = f" tok{j - 1}{HELD_CHAR}{text}"
    return text


def chunk_sizes(sent: int, generated: int, finished: bool, interval: int, merge: bool) -> list[int]:
    """How many tokens each chunk a choice sends now carries, `sent` of its `generated`
    tokens already out: its first token at once, then `interval` at a time (vLLM's
    `--stream-interval`), the rest at its finish; with `merge`, everything pending in one
    chunk (vLLM's API server merges the outputs it fell behind on)."""
    pending = generated - sent
    if merge:
        return [pending] if pending and (finished or sent == 0 or pending >= interval) else []
    sizes = []
    if sent == 0 and pending:
        sizes.append(1)
        pending -= 1
    while pending >= interval:
        sizes.append(interval)
        pending -= interval
    if pending and finished:
        sizes.append(pending)
    return sizes


def tool_call_id(finish_reason: str) -> str | None:
    """A fresh tool-call id if the output is a tool call, else None."""
    return f"chatcmpl-tool-{uuid.uuid4().hex[:16]}" if finish_reason == "tool_calls" else None


def fingerprint(engines: int) -> str:
    return f"vllm-0.32.0-dp{engines}-emulated"


def usage(prompt: int, completion: int, *, details: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        body["prompt_tokens_details"] = None
        body["completion_tokens_details"] = None
    return body


def error_object(status: int, kind: str, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_body(status: int, kind: str, message: str, param: str | None = None) -> bytes:
    """An error answer (HTTP status != 200): vLLM's ErrorResponse, compact."""
    return dumps(error_object(status, kind, message, param))


#: a generation error in the middle of a stream: vLLM writes it with `json.dumps`
STREAM_ERROR_LINE = (
    b"data: "
    + json.dumps(error_object(500, "InternalServerError", "Internal server error")).encode()
    + b"\n\n"
)


@dataclass
class StreamShape:
    """One streaming response's constants; builds each of its `data:` lines."""

    response_id: str
    created: int
    model: str
    chat: bool
    prompt_tokens: int
    include_usage: bool
    continuous_usage: bool
    system_fingerprint: str

    def __post_init__(self) -> None:
        # The common chunk (a token of text, no usage, not the last) is written from two
        # byte templates around its text: the emulator writes thousands a second, and
        # building and dumping its dict costs twenty times more. `chunk` checks nothing
        # else differs: the templates are cut from the dict it would dump.
        self._templates: dict[int, tuple[bytes, bytes]] = {}

    def _template(self, index: int) -> tuple[bytes, bytes]:
        cut = self._templates.get(index)
        if cut is None:
            marker = "\u0000MARK\u0000"
            line = self._build(index, marker, 0, None, None, None)
            before, after = line.split(dumps(marker))
            cut = self._templates[index] = (before, after)
        return cut

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }

    def role(self, index: int) -> bytes:
        """Chat's first chunk of a choice: the role, no token."""
        body = self._head()
        body["choices"] = [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        if self.continuous_usage:
            body["usage"] = {**usage(self.prompt_tokens, 0), "completion_tokens_details": None}
        body["prompt_token_ids"] = None
        body["prompt_text"] = None
        return b"data: " + dumps(body) + b"\n\n"

    def chunk(
        self,
        index: int,
        text: str,
        generated: int,
        finish_reason: str | None,
        stop_reason: str | int | None,
        *,
        tool_call: str | None = None,
    ) -> bytes:
        """One engine output of choice `index` (1..k tokens, `generated` so far).

        `tool_call`: the call's id when this is the first delta of a tool call, "" for a
        later one, None for text.
        """
        if finish_reason is None and tool_call is None and not self.continuous_usage:
            before, after = self._template(index)
            return before + dumps(text) + after
        return self._build(index, text, generated, finish_reason, stop_reason, tool_call)

    def _build(
        self,
        index: int,
        text: str,
        generated: int,
        finish_reason: str | None,
        stop_reason: str | int | None,
        tool_call: str | None,
    ) -> bytes:
        body = self._head()
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            if tool_call is None:
                choice["delta"] = {"content": text}
            elif tool_call:
                function = {"name": TOOL_NAME, "arguments": text}
                call = {"id": tool_call, "type": "function", "index": 0, "function": function}
                choice["delta"] = {"tool_calls": [call]}
            else:
                choice["delta"] = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
            choice["logprobs"] = None
            choice["finish_reason"] = finish_reason
            if finish_reason is not None:
                choice["stop_reason"] = stop_reason
            choice["token_ids"] = None
        else:
            choice["text"] = text
            choice["logprobs"] = None
            choice["finish_reason"] = finish_reason
            choice["stop_reason"] = stop_reason
            choice["prompt_token_ids"] = None
            choice["token_ids"] = None
        body["choices"] = [choice]
        if self.continuous_usage:
            body["usage"] = usage(self.prompt_tokens, generated)
            if self.chat:
                body["usage"]["completion_tokens_details"] = None
        if finish_reason is not None and not self.include_usage:
            body["system_fingerprint"] = self.system_fingerprint
        return b"data: " + dumps(body) + b"\n\n"

    def usage_chunk(self, completion_tokens: int) -> bytes:
        """The last chunk before [DONE] when the client asked for usage: every choice's."""
        body = self._head()
        body["choices"] = []
        body["usage"] = usage(self.prompt_tokens, completion_tokens)
        body["system_fingerprint"] = self.system_fingerprint
        return b"data: " + dumps(body) + b"\n\n"


@dataclass
class Choice:
    """One finished choice of a non-streaming answer."""

    text: str
    tokens: int
    finish_reason: str
    stop_reason: str | int | None
    tool_call: str | None = None  # the call's id when the output is a tool call


def unary_body(
    response_id: str,
    created: int,
    model: str,
    chat: bool,
    prompt_tokens: int,
    choices: list[Choice],
    system_fingerprint: str,
) -> bytes:
    """A non-streaming answer: every choice by index, and usage over all of them."""
    rendered = []
    for index, c in enumerate(choices):
        item: dict[str, Any] = {"index": index}
        if chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None if c.tool_call else c.text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
            }
            if c.tool_call:
                message["tool_calls"] = [
                    {
                        "id": c.tool_call,
                        "type": "function",
                        "function": {"name": TOOL_NAME, "arguments": c.text},
                    }
                ]
            message["reasoning"] = None
            item["message"] = message
            item.update(logprobs=None, finish_reason=c.finish_reason, stop_reason=c.stop_reason)
            item.update(token_ids=None, routed_experts=None)
        else:
            item.update(text=c.text, logprobs=None, finish_reason=c.finish_reason)
            item.update(stop_reason=c.stop_reason, token_ids=None, prompt_logprobs=None)
            item.update(prompt_token_ids=None, routed_experts=None)
        rendered.append(item)
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": rendered,
        "service_tier": None,
        "system_fingerprint": system_fingerprint,
        "usage": usage(prompt_tokens, sum(c.tokens for c in choices), details=True),
    }
    if chat:
        body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return dumps(body)
