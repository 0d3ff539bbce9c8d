"""The SSE tap: a transparent proxy between the router and the decode workers.

The router sends `POST /{worker}/v1/completions` (or chat) to the tap instead of to the
worker; the tap forwards the request, streams every byte of the answer back unchanged,
and meanwhile tells the shadow service what happened: `ready` and `dispatch` when the
request passes (prefill is done by then in a P/D fleet), cumulative `progress` at most
once per request every `progress_interval_s`, and `finish` with the reason (`cancelled`
when the client goes away, `error` when the worker fails mid-stream). Events go through a
non-blocking sink, so the stream never waits for the service.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from shadow.connectors.sink import HttpEventSink
from shadow.events import (
    DispatchEvent,
    FinishEvent,
    ProgressEvent,
    ReadyEvent,
    RouterView,
    WorkerEvent,
)
from shadow.world.event_wire import sink_fields

#: Headers a proxy must not forward (RFC 9110 connection-specific ones, and length,
#: which the server recomputes for a streamed body).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
     "trailer", "transfer-encoding", "upgrade", "content-length", "host"}
)  # fmt: skip
GENERATION_PATHS = frozenset({"v1/completions", "v1/chat/completions"})


def proxy_client() -> httpx.AsyncClient:
    """The client a streaming proxy needs: no read timeout (streams are long), many
    connections (one per stream in flight)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=5.0),
        limits=httpx.Limits(max_connections=2000, max_keepalive_connections=500),
    )


def _words(content: object) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):  # chat content as parts: count the text parts
        return sum(_words(p.get("text", "")) for p in content if isinstance(p, dict))
    return 0


def prompt_tokens_of(body: dict) -> int:
    """Prompt length as the emulator and the load generator count it."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        return max(1, len(prompt))
    if isinstance(prompt, str):
        return max(1, _words(prompt))
    messages = body.get("messages") or []
    return max(1, sum(_words(m.get("content", "")) for m in messages if isinstance(m, dict)))


def prompt_hash_of(body: dict) -> str:
    """A stable key of the prompt (ExactMatch groups requests by it)."""
    material = json.dumps(body.get("prompt", body.get("messages")), sort_keys=True)
    return hashlib.blake2b(material.encode(), digest_size=8).hexdigest()


@dataclass
class _Stream:
    """Counts tokens in an SSE stream without changing it."""

    tokens: int = 0
    finish_reason: str | None = None
    usage_tokens: int | None = None
    done: bool = False
    _rest: bytes = b""

    def feed(self, chunk: bytes) -> None:
        data = self._rest + chunk
        *events, self._rest = data.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    continue
                try:
                    message = json.loads(payload)
                except ValueError:
                    continue
                usage = message.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    self.usage_tokens = int(usage["completion_tokens"])
                for choice in message.get("choices") or ():
                    delta = choice.get("delta")
                    text = choice.get("text") if delta is None else delta.get("content")
                    if text:
                        self.tokens += 1
                    if choice.get("finish_reason"):
                        self.finish_reason = choice["finish_reason"]

    @property
    def output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.tokens


class Tap:
    """The tap for one fleet: workers by id, a sink for events."""

    def __init__(
        self,
        workers: dict[str, str],
        sink: HttpEventSink,
        *,
        capacity: int,
        policy: str = "jsq",
        progress_interval_s: float = 0.1,
        emit_ready: bool = True,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        """`emit_ready=False` when the router announces `ready` itself (it has a pool)."""
        self.emit_ready = emit_ready
        self.workers = dict(workers)
        self.sink = sink
        self.capacity = capacity
        self.policy = policy
        self.progress_interval_s = progress_interval_s
        self._client = client
        self.down: set[str] = set()
        self.app = Starlette(
            routes=[Route("/{worker}/{path:path}", self.forward, methods=["GET", "POST"])],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self._startup()
        try:
            yield
        finally:
            await self._shutdown()

    async def _startup(self) -> None:
        if self._client is None:
            self._client = proxy_client()
        now = time.time()
        for worker in self.workers:
            self.sink.put(sink_fields(WorkerEvent(ts=now, worker=worker, capacity=self.capacity)))

    async def _shutdown(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def _worker_down(self, worker: str) -> None:
        if worker not in self.down:
            self.down.add(worker)
            event = WorkerEvent(ts=time.time(), worker=worker, capacity=self.capacity, state="down")
            self.sink.put(sink_fields(event))

    async def forward(self, request: Request) -> Response:
        worker = request.path_params["worker"]
        path = request.path_params["path"]
        base = self.workers.get(worker)
        if base is None:
            return JSONResponse({"error": f"unknown worker {worker!r}"}, status_code=404)
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        generation = request.method == "POST" and path in GENERATION_PATHS
        request_id = None
        if generation:
            request_id = request.headers.get("x-request-id") or f"tap-{uuid.uuid4().hex}"
            headers["x-request-id"] = request_id
            self._announce(worker, request_id, body, request.headers)
        assert self._client is not None
        upstream_request = self._client.build_request(
            request.method, f"{base}/{path}", headers=headers, content=body,
            params=request.query_params,
        )  # fmt: skip
        try:
            upstream = await self._client.send(upstream_request, stream=True)
        except httpx.HTTPError as error:
            if request_id is not None:
                self._finish(request_id, 0, "error")
            self._worker_down(worker)
            return JSONResponse({"error": f"worker {worker} unreachable: {error}"}, 502)
        response_headers = {
            k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
        }
        if request_id is None:
            content = await upstream.aread()
            await upstream.aclose()
            return Response(content, upstream.status_code, response_headers)
        return StreamingResponse(
            self._relay(worker, request_id, upstream),
            status_code=upstream.status_code,
            headers=response_headers,
        )

    def _announce(
        self, worker: str, request_id: str, body: bytes, headers: Sequence[tuple[str, str]] | dict
    ) -> None:
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {}
        now = time.time()
        if self.emit_ready:
            ready = ReadyEvent(
                ts=now,
                request_id=request_id,
                prompt_tokens=prompt_tokens_of(parsed),
                prompt_hash=prompt_hash_of(parsed),
            )
            self.sink.put(sink_fields(ready))
        router_view = None
        view = headers.get("x-router-view")
        if view:
            with contextlib.suppress(msgspec.MsgspecError):  # a view that is not one: left out
                router_view = msgspec.json.decode(view, type=dict[str, RouterView])
        dispatch = DispatchEvent(
            ts=now,
            request_id=request_id,
            worker=worker,
            policy=headers.get("x-router-policy") or self.policy,
            router_view=router_view,
        )
        self.sink.put(sink_fields(dispatch))

    def _finish(self, request_id: str, tokens: int, reason: str) -> None:
        event = FinishEvent(
            ts=time.time(), request_id=request_id, output_tokens=tokens, reason=reason
        )
        self.sink.put(sink_fields(event))

    def _progress(self, request_id: str, generated: int) -> None:
        event = ProgressEvent(ts=time.time(), request_id=request_id, generated=generated)
        self.sink.put(sink_fields(event))

    async def _relay(
        self, worker: str, request_id: str, upstream: httpx.Response
    ) -> AsyncIterator[bytes]:
        """Yield the worker's bytes unchanged while counting tokens for the events."""
        stream = _Stream()
        reported = 0
        last_report = 0.0
        reason = "error"
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
                stream.feed(chunk)
                now = time.monotonic()
                if stream.tokens > reported and now - last_report >= self.progress_interval_s:
                    reported, last_report = stream.tokens, now
                    self._progress(request_id, reported)
            if stream.done or stream.finish_reason:
                reason = stream.finish_reason or "stop"
            elif upstream.status_code == 200:
                self._worker_down(worker)  # the worker closed the stream unfinished
        except httpx.HTTPError:
            self._worker_down(worker)
        except BaseException:  # the client went away (cancellation) or we are shutting down
            reason = "cancelled"
            raise
        finally:
            with contextlib.suppress(Exception):
                await upstream.aclose()
            if stream.tokens > reported:
                self._progress(request_id, stream.tokens)
            self._finish(request_id, stream.output_tokens, reason)
