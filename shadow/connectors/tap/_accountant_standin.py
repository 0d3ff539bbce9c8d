"""A minimal stand-in for `shadow.connectors.openai_stream.StreamAccountant`.

Another change writes the real accountant (to the design's API); the tap codes against
that API, and this stand-in exists only until it lands on main, then goes. It covers the
shapes the emulator sends: SSE chunks per choice, usage, [DONE], an error object, a
non-streaming body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Update:
    choice: int
    tokens: int
    estimated: bool
    finished: bool
    reason: str | None
    raw_reason: str | None


class StreamAccountant:
    def __init__(self, endpoint: str = "completions", n: int = 1, stream: bool = True) -> None:
        self.endpoint = endpoint
        self.n = max(1, n)
        self.stream = stream
        self.response_id: str | None = None
        self._rest = b""
        self._counts = [0] * self.n
        self._usage: int | None = None
        self._finished: dict[int, tuple[str, str | None]] = {}
        self._reported: set[int] = set()
        self._error = False

    def feed(self, data: bytes) -> list[Update]:
        if not self.stream:
            self._rest += data
            return []
        data = (self._rest + data).replace(b"\r\n", b"\n")
        *events, self._rest = data.split(b"\n\n")
        before = list(self._counts)
        done = False
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    done = self._message(line[5:].strip()) or done
        if done:
            return self.close()
        return [
            Update(i, count, True, False, None, None)
            for i, (count, old) in enumerate(zip(self._counts, before, strict=True))
            if count != old
        ]

    def _message(self, payload: bytes) -> bool:
        """True at [DONE]."""
        if payload == b"[DONE]":
            return True
        try:
            message = json.loads(payload)
        except ValueError:
            return False
        if not isinstance(message, dict):
            return False
        if "error" in message:
            self._error = True
            return False
        self.response_id = self.response_id or message.get("id")
        usage = message.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None and self.n == 1:
            self._usage = int(usage["completion_tokens"])
        for choice in message.get("choices") or ():
            index = int(choice.get("index", 0))
            if not 0 <= index < self.n:
                continue
            delta = choice.get("delta")
            if delta is None:
                carries = "text" in choice or "message" in choice
            else:
                carries = any(delta.get(k) for k in ("content", "reasoning", "reasoning_content",
                                                     "tool_calls"))  # fmt: skip
            if carries:
                self._counts[index] += 1
            if choice.get("finish_reason"):
                reason, raw = choice["finish_reason"], choice.get("stop_reason")
                if reason == "stop" and raw == "recomputed":
                    reason = "recomputed"
                self._finished[index] = (reason, None if raw is None else str(raw))
        return False

    def close(self, client_gone: bool = False, upstream_error: str | None = None) -> list[Update]:
        if not self.stream and self._rest:
            self._message(self._rest)
            if self.n == 1 and self._usage is None:
                self._counts[0] = 0
        exact = self._usage is not None
        updates = []
        for index in range(self.n):
            if index in self._finished:
                reason, raw = self._finished[index]
            elif client_gone:
                reason, raw = "cancelled", None
            else:
                reason, raw = "error", None
            if self._error and index not in self._finished:
                reason = "error"
            tokens = self._usage if exact and self._usage is not None else self._counts[index]
            if index not in self._reported:
                self._reported.add(index)
                updates.append(Update(index, tokens, not exact, True, reason, raw))
        return updates
