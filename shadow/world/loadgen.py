"""Replay a workload against an OpenAI-compatible endpoint with concurrent streaming clients.

This is the traffic that drives a live (or emulated) fleet through the router and the tap,
so it records per request what a client saw: status, token chunks, a digest of the exact
body (to prove the tap changes no byte), and whether it finished, was cancelled or failed.
A failed request is an outcome, never an exception: load tests must run to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from shadow.replay.workload import Workload

DONE = b"[DONE]"


@dataclass
class RequestOutcome:
    """What the client saw for request `index` (times are `time.time()` seconds)."""

    index: int
    request_id: str
    status: int | None
    #: tokens received: the usage count when the engine sent one, else token chunks
    tokens: int
    digest: str
    complete: bool
    cancelled: bool
    error: str | None
    sent_at: float
    first_byte_at: float | None
    done_at: float | None
    usage_completion_tokens: int | None = None


# httpcore's pool scans all its connections for every queued request on every request start
# and end: one client slows quadratically past a few hundred concurrent streams (measured:
# 1,500 streams in 1 s starve the event loop into connect timeouts). Requests are spread
# round-robin over several clients instead, each with a bounded pool.
CLIENT_SHARDS = 16
CONNECTIONS_PER_CLIENT = 256


def default_client(
    max_connections: int = CONNECTIONS_PER_CLIENT, verify: ssl.SSLContext | bool = True
) -> httpx.AsyncClient:
    """A client for long streams: no read/pool timeout, 10 s to connect, a bounded pool.

    Pass one `verify` context to many clients: building one costs about 30 ms.
    """
    return httpx.AsyncClient(
        verify=verify,
        timeout=httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None),
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=min(64, max_connections),
        ),
    )


def request_body(
    prompt_tokens: int, output_tokens: int, *, model: str, chat: bool
) -> dict[str, Any]:
    """The JSON body: `prompt_tokens` prompt tokens (at least 1), exactly `output_tokens` out."""
    prompt_len = max(1, int(prompt_tokens))
    body: dict[str, Any] = {"model": model}
    if chat:
        body["messages"] = [{"role": "user", "content": " ".join(["hello"] * prompt_len)}]
    else:
        body["prompt"] = [1] * prompt_len
    body.update(
        max_tokens=int(output_tokens),
        ignore_eos=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    return body


def _token_text(chunk: dict[str, Any]) -> bool:
    """True when an SSE chunk carries generated text (completions or chat deltas)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(delta.get("content"))


class _StreamState:
    """Incremental SSE reader: splits lines across chunk boundaries, counts token chunks
    (the trigger of a cancellation after k chunks) and keeps the usage count."""

    def __init__(self) -> None:
        self.head = b""  # the first bytes, to quote in an error
        self.buffer = b""
        self.tokens = 0
        self.done = False
        self.error: str | None = None
        self.usage_completion_tokens: int | None = None

    def feed(self, data: bytes) -> None:
        if len(self.head) < 200:
            self.head += data[: 200 - len(self.head)]
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == DONE:
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        if "error" in chunk and self.error is None:
            error = chunk["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            self.error = f"stream error: {message}"
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_completion_tokens = usage["completion_tokens"]
        if _token_text(chunk):
            self.tokens += 1


async def _one_request(
    client: httpx.AsyncClient,
    url: str,
    index: int,
    request_id: str,
    body: dict[str, Any],
    cancel_after: int | None,
) -> RequestOutcome:
    digest = hashlib.sha256()
    stream = _StreamState()
    status: int | None = None
    first_byte_at: float | None = None
    cancelled = False
    error: str | None = None
    sent_at = time.time()
    headers = {"x-request-id": request_id, "accept-encoding": "identity"}
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            status = response.status_code
            if cancel_after is not None and cancel_after <= 0 and status == 200:
                cancelled = True
            else:
                async for data in response.aiter_bytes():
                    if first_byte_at is None:
                        first_byte_at = time.time()
                    digest.update(data)
                    stream.feed(data)
                    if (
                        cancel_after is not None
                        and status == 200
                        and stream.tokens >= cancel_after
                        and not stream.done
                    ):
                        cancelled = True  # leaving the block closes the connection mid-stream
                        break
            if status != 200:
                detail = stream.head.decode("utf-8", "replace").strip()
                error = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    except Exception as exc:  # recorded on the outcome: one failed request never stops a run
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if error is None and stream.error is not None:
        error = stream.error
    if error is None and not cancelled and not stream.done:
        error = "stream ended before [DONE]"
    return RequestOutcome(
        index=index,
        request_id=request_id,
        status=status,
        # the engine's own count when it sent one: a chunk may carry several tokens (a
        # lagging stream's merged outputs) or none (a token ending mid-character)
        tokens=(
            stream.usage_completion_tokens
            if stream.usage_completion_tokens is not None
            else stream.tokens
        ),
        digest=digest.hexdigest(),
        complete=stream.done,
        cancelled=cancelled,
        error=error,
        sent_at=sent_at,
        first_byte_at=first_byte_at,
        done_at=time.time(),
        usage_completion_tokens=stream.usage_completion_tokens,
    )


async def run_load(
    url: str,
    workload: Workload,
    *,
    time_scale: float = 1.0,
    model: str = "emulated-model",
    chat: bool = False,
    request_id_prefix: str = "lg",
    cancel_after: dict[int, int] | None = None,
    max_in_flight: int | None = None,
    client: httpx.AsyncClient | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[RequestOutcome]:
    """Send request i at `ready_s[i] / time_scale` s after the start; outcomes by index.

    Request i carries `x-request-id: {request_id_prefix}-{i}`. `cancel_after[i] = k` closes
    request i's connection after k token chunks (a client disconnect; at the first read that
    brings the count to k or more, so a read holding several events can overshoot k;
    k = 0 closes right after the response headers). With `max_in_flight`,
    a request waits for a free slot, in order, and its `sent_at` shows the delay.
    `progress(done, total)` is called after each request ends. Without `client`, requests
    go round-robin over `CLIENT_SHARDS` clients (4,096 connections in all); a given
    `client` carries them all.
    """
    if not math.isfinite(time_scale) or time_scale <= 0:
        raise ValueError(f"time_scale must be a positive number, got {time_scale}")
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    endpoint = url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    cancels = cancel_after or {}
    total = len(workload)
    offsets = np.maximum(np.asarray(workload.ready_s, dtype=np.float64) / time_scale, 0.0)
    outcomes: list[RequestOutcome | None] = [None] * total
    slots = asyncio.Semaphore(max_in_flight) if max_in_flight is not None else None
    finished = 0

    async with contextlib.AsyncExitStack() as stack:
        if client is not None:
            clients = [client]
        else:
            tls = httpx.create_ssl_context()
            clients = [
                await stack.enter_async_context(default_client(verify=tls))
                for _ in range(CLIENT_SHARDS)
            ]

        async def send(i: int) -> None:
            nonlocal finished
            try:
                body = request_body(
                    int(workload.prompt_tokens[i]),
                    int(workload.output_tokens[i]),
                    model=model,
                    chat=chat,
                )
                outcomes[i] = await _one_request(
                    clients[i % len(clients)],
                    endpoint,
                    i,
                    f"{request_id_prefix}-{i}",
                    body,
                    cancels.get(i),
                )
            finally:
                if slots is not None:
                    slots.release()
            finished += 1
            if progress is not None:
                progress(finished, total)

        loop = asyncio.get_running_loop()
        start = loop.time()
        async with asyncio.TaskGroup() as group:
            for i in range(total):
                delay = start + float(offsets[i]) - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if slots is not None:
                    await slots.acquire()
                group.create_task(send(i), name=f"loadgen:{request_id_prefix}-{i}")
    return [outcome for outcome in outcomes if outcome is not None]


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize_load(outcomes: list[RequestOutcome]) -> dict[str, Any]:
    """Counts, token throughput over the run (first send to last end) and first-byte latency."""
    tokens = sum(outcome.tokens for outcome in outcomes)
    first_byte = [
        outcome.first_byte_at - outcome.sent_at
        for outcome in outcomes
        if outcome.first_byte_at is not None
    ]
    ends = [outcome.done_at for outcome in outcomes if outcome.done_at is not None]
    duration = (max(ends) - min(o.sent_at for o in outcomes)) if outcomes and ends else 0.0
    statuses: dict[str, int] = {}
    for outcome in outcomes:
        key = "none" if outcome.status is None else str(outcome.status)
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "sent": len(outcomes),
        "complete": sum(outcome.complete for outcome in outcomes),
        "cancelled": sum(outcome.cancelled for outcome in outcomes),
        "errors": sum(outcome.error is not None for outcome in outcomes),
        "statuses": statuses,
        "tokens": tokens,
        "duration_s": duration,
        "tokens_per_s": tokens / duration if duration > 0 else 0.0,
        "first_byte_p50_s": _percentile(first_byte, 50),
        "first_byte_p95_s": _percentile(first_byte, 95),
    }
