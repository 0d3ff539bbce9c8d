"""Token accounting of an OpenAI-compatible response, exact where the response says so.

The tap sees only the bytes vLLM sends. A chunk carries 0..k tokens (merged outputs,
`--stream-interval`, speculative decoding), tokens ending mid-UTF-8 stream as empty text,
and chat answers carry reasoning and tool-call deltas, so counting non-empty text chunks
is wrong. This module turns the bytes, split anywhere, into per-choice updates:

- exact counts from `usage` (continuous usage per chunk, the final usage-only chunk, the
  non-streaming body), `estimated=False`;
- otherwise one token per chunk that carries output for the choice (empty text included;
  a chat role-only chunk counts nothing), flagged `estimated=True`: a lower bound, so
  progress never overshoots the final count;
- finish reasons as vLLM and vllm-ascend send them: `stop` with `stop_reason ==
  "recomputed"` is `recomputed` (a re-dispatch, not a finish), an error object is `error`
  for every unfinished choice, a stream that ends without a finish is `cancelled` when the
  client left and `error` otherwise, an unknown reason is kept as sent.

The last choice to finish is held until the end of the stream (the usage chunk follows it
at once), so a plain n = 1 stream with usage gives one exact finish instead of an estimate
and a correction. With n > 1 earlier choices finish when their finish chunk arrives; a
choice finished with an estimate gets one more finished update when the usage makes its
count exact (a correction, never a second finish of an exact count).

Pure: bytes in, updates out; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

Endpoint = Literal["completions", "chat"]

#: chat delta keys that carry generated tokens (vLLM 0.32 names reasoning `reasoning`;
#: older servers and other engines use `reasoning_content`)
_OUTPUT_KEYS = ("content", "reasoning", "reasoning_content", "tool_calls")
#: finish reasons whose final chunk may carry no token (the engine stopped the request
#: without sampling): an empty final chunk with one of these counts nothing
_TOKENLESS_REASONS = frozenset({"abort", "error", "recomputed", "cancelled"})
#: vllm-ascend's recompute scheduler marks a decode stream it gives back to its proxy so
RECOMPUTED = "recomputed"
_DONE = b"[DONE]"
_HEAD_LIMIT = 1 << 16
#: choices beyond this index are ignored: memory stays bounded whatever the upstream sends
#: (vLLM numbers completions' choices prompt * n + i, so a batch of prompts goes far)
MAX_CHOICES = 4096
_decode = msgspec.json.Decoder().decode


@dataclass(slots=True)
class Update:
    """The state of one choice after some bytes: cumulative `tokens` (exact unless
    `estimated`), and once `finished`, the mapped `reason` and the `raw_reason` behind it
    (vLLM's `stop_reason`, or the reason as sent when it was mapped). Not frozen: one is
    built per chunk on the tap's hot path, and a frozen dataclass's `__init__` costs
    several times a plain one's; nothing keeps or changes them after they are read."""

    choice: int
    tokens: int
    estimated: bool
    finished: bool
    reason: str | None = None
    raw_reason: str | None = None


@dataclass(slots=True)
class _Choice:
    tokens: int = 0
    exact: bool = False
    reason: str | None = None
    raw_reason: str | None = None
    #: a finish seen in the bytes; `emitted` once it went out as an update
    finished: bool = False
    emitted: bool = False
    emitted_exact: bool = False
    last_sent: tuple[int, bool] | None = None


@dataclass
class StreamAccountant:
    """One response's accounting. `feed` the upstream bytes as they arrive (any split),
    then `close` once at the end of the response; both return the updates they caused."""

    endpoint: Endpoint = "completions"
    n: int = 1
    stream: bool = True
    response_id: str | None = None
    _choices: dict[int, _Choice] = field(default_factory=dict)
    _buffer: bytearray = field(default_factory=bytearray)
    _data: list[bytes] = field(default_factory=list)
    _ended: bool = False
    _saw_event: bool = False
    #: a streaming request's first bytes, kept until the first event: an upstream that
    #: refuses the request answers with a JSON error body, not an event stream
    _head: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint: expected 'completions' or 'chat', got {self.endpoint!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n: expected an integer >= 1, got {self.n!r}")
        for i in range(self.n):
            self._choices[i] = _Choice()

    # -- input ---------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> list[Update]:
        """Account for the next bytes of the response body."""
        if self._ended or not chunk:
            return []
        if not self.stream:
            self._buffer += chunk
            return []  # a JSON body is read whole at close
        if not self._saw_event and len(self._head) < _HEAD_LIMIT:
            self._head += chunk
        updates: list[Update] = []
        if not self._buffer and not self._data and chunk.startswith(b"data:"):
            # the usual chunk, one whole event as vLLM writes it: no framing to carry over
            end = chunk.find(b"\n")
            if end == len(chunk) - 2 and chunk[-1] == 10:
                self._payload(chunk[5:end].strip(), updates)
                return updates
        self._buffer += chunk
        buffer = self._buffer
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line, updates)
            if self._ended:
                break
        del buffer[:start]
        return updates

    def close(self, client_gone: bool = False, upstream_error: object = None) -> list[Update]:
        """The response ended (normally, because the client left, or because the upstream
        failed): finish every choice still open and return the last updates."""
        updates: list[Update] = []
        if not self._ended:
            if self.stream:
                if self._buffer:  # a last event without its blank line
                    for line in bytes(self._buffer).splitlines():
                        self._line(line, updates)
                    self._buffer.clear()
                if self._data:
                    self._event(updates)
                if not self._saw_event:  # an error answered as JSON to a streaming request
                    self._buffer[:] = self._head
                    self._body(updates)
            else:
                self._body(updates)
        self._ended = True
        reason = "cancelled" if client_gone and upstream_error is None else "error"
        for choice in self._choices.values():
            if not choice.finished:
                choice.finished, choice.reason = True, reason
        self._flush_finished(updates, final=True)
        return updates

    # -- SSE framing ---------------------------------------------------------------------

    def _line(self, line: bytes, updates: list[Update]) -> None:
        if not line:
            if self._data:
                self._event(updates)
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        # comments (":"), event:, id:, retry: carry no tokens

    def _event(self, updates: list[Update]) -> None:
        payload = b"\n".join(self._data).strip()
        self._data.clear()
        self._payload(payload, updates)

    def _payload(self, payload: bytes, updates: list[Update]) -> None:
        self._saw_event = True
        if payload == _DONE:
            self._ended = True
            self._flush_finished(updates, final=True)
            return
        try:
            message = _decode(payload)
        except msgspec.DecodeError:
            return  # not JSON: nothing to count (a proxy's keep-alive, a partial tail)
        if isinstance(message, dict):
            self._message(message, updates)

    # -- messages ------------------------------------------------------------------------

    def _message(self, message: dict[str, Any], updates: list[Update]) -> None:
        if self.response_id is None and isinstance(message.get("id"), str):
            self.response_id = message["id"]
        if "error" in message and not message.get("choices"):
            self._error(updates)
            return
        choices = message.get("choices")
        if not isinstance(choices, list):
            choices = []
        usage = _completion_tokens(message.get("usage"))
        for entry in choices:
            if isinstance(entry, dict):
                self._chunk_choice(entry, usage if len(choices) == 1 else None, updates)
        if usage is not None and not choices:
            self._total(usage)
            self._flush_finished(updates, final=False, corrections_only=True)

    def _chunk_choice(
        self, entry: dict[str, Any], usage: int | None, updates: list[Update]
    ) -> None:
        index = entry.get("index", 0)
        if not isinstance(index, int) or not 0 <= index < MAX_CHOICES:
            return
        choice = self._choices.setdefault(index, _Choice())
        if choice.finished:
            return  # a duplicate after the finish carries nothing new
        reason = entry.get("finish_reason")
        reason = reason if isinstance(reason, str) and reason else None
        stop_reason = entry.get("stop_reason")
        if usage is not None:  # continuous usage: this choice's count so far, exact
            choice.tokens = max(choice.tokens, usage)
            choice.exact = True
        elif not choice.exact and self._carries_output(entry, reason, stop_reason):
            choice.tokens += 1
        if reason is not None:
            choice.finished = True
            choice.reason, choice.raw_reason = _map_reason(reason, stop_reason)
            if self._open_count() > 0 or choice.exact:
                self._emit_finish(index, choice, updates)
            return  # the last open choice waits for the usage chunk or [DONE]
        self._emit_progress(index, choice, updates)

    def _carries_output(self, entry: dict[str, Any], reason: str | None, stop_reason: Any) -> bool:
        if self.endpoint == "completions" or "text" in entry:
            text = entry.get("text")
            if not isinstance(text, str):
                return False
            if text:
                return True
            return not _tokenless(reason, stop_reason)
        delta = entry.get("delta")
        if not isinstance(delta, dict):
            delta = entry.get("message")
            if not isinstance(delta, dict):
                return False
        present = [delta[key] for key in _OUTPUT_KEYS if delta.get(key) is not None]
        if any(present):
            return True
        if "role" in delta:
            return False  # the role-only first chunk: no token yet
        return bool(present) and not _tokenless(reason, stop_reason)

    def _error(self, updates: list[Update]) -> None:
        for choice in self._choices.values():
            if not choice.finished:
                choice.finished = True
                choice.reason, choice.raw_reason = "error", None
        self._flush_finished(updates, final=True)

    def _body(self, updates: list[Update]) -> None:
        """A non-streaming answer (or an error body): the whole JSON, usage included."""
        try:
            message = _decode(bytes(self._buffer))
        except msgspec.DecodeError:
            return
        self._buffer.clear()
        if not isinstance(message, dict):
            return
        if self.response_id is None and isinstance(message.get("id"), str):
            self.response_id = message["id"]
        if "error" in message and not message.get("choices"):
            self._error(updates)
            return
        for entry in message.get("choices") or ():
            index = entry.get("index", 0) if isinstance(entry, dict) else None
            if not isinstance(index, int) or not 0 <= index < MAX_CHOICES:
                continue
            choice = self._choices.setdefault(index, _Choice())
            reason = entry.get("finish_reason")
            reason = reason if isinstance(reason, str) and reason else None
            if self._carries_output(entry, reason, entry.get("stop_reason")):
                choice.tokens = max(choice.tokens, 1)
            if reason is not None:
                choice.finished = True
                choice.reason, choice.raw_reason = _map_reason(reason, entry.get("stop_reason"))
        usage = _completion_tokens(message.get("usage"))
        if usage is not None:
            self._total(usage)

    # -- exactness -----------------------------------------------------------------------

    def _total(self, total: int) -> None:
        """The usage of all choices together: exact for each choice when it can be split
        (one choice unknown, or the lower bounds already add up to it)."""
        unknown = [c for c in self._choices.values() if not c.exact]
        remainder = total - sum(c.tokens for c in self._choices.values() if c.exact)
        if not unknown or remainder < 0:
            return
        if len(unknown) == 1:
            if remainder >= unknown[0].tokens:
                unknown[0].tokens, unknown[0].exact = remainder, True
        elif sum(c.tokens for c in unknown) == remainder:
            for choice in unknown:
                choice.exact = True

    # -- output --------------------------------------------------------------------------

    def _open_count(self) -> int:
        return sum(1 for c in self._choices.values() if not c.finished)

    def _emit_progress(self, index: int, choice: _Choice, updates: list[Update]) -> None:
        state = (choice.tokens, not choice.exact)
        if state != choice.last_sent and choice.tokens > 0:
            choice.last_sent = state
            updates.append(Update(index, choice.tokens, not choice.exact, False))

    def _emit_finish(self, index: int, choice: _Choice, updates: list[Update]) -> None:
        choice.emitted, choice.emitted_exact = True, choice.exact
        choice.last_sent = (choice.tokens, not choice.exact)
        updates.append(
            Update(index, choice.tokens, not choice.exact, True, choice.reason, choice.raw_reason)
        )

    def _flush_finished(
        self, updates: list[Update], *, final: bool, corrections_only: bool = False
    ) -> None:
        """Emit held finishes (at the end, or once the usage chunk came) and corrections of
        finishes sent as estimates that are now exact."""
        for index in sorted(self._choices):
            choice = self._choices[index]
            if not choice.finished:
                continue
            if not choice.emitted:
                if final or not corrections_only or choice.exact:
                    self._emit_finish(index, choice, updates)
            elif choice.exact and not choice.emitted_exact:
                self._emit_finish(index, choice, updates)


def _completion_tokens(usage: object) -> int | None:
    if isinstance(usage, dict):
        value = usage.get("completion_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _tokenless(reason: str | None, stop_reason: object) -> bool:
    if reason is None:
        return False
    return reason in _TOKENLESS_REASONS or stop_reason == RECOMPUTED


def _map_reason(reason: str, stop_reason: object) -> tuple[str, str | None]:
    """vLLM's finish reason as the shadow's event names it, and the raw reason behind it."""
    raw = None if stop_reason is None or isinstance(stop_reason, bool) else str(stop_reason)
    if reason == "stop" and stop_reason == RECOMPUTED:
        return RECOMPUTED, RECOMPUTED
    return reason, raw
