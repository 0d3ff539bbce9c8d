"""An emulated vLLM data-parallel decode fleet: real HTTP servers on loopback.

The demo and the end-to-end tests need a fleet that speaks vLLM's wire format (OpenAI
completions and chat, SSE streaming, vLLM-named Prometheus metrics) and steps the way the
replay engine assumes, so that what the shadow service observes can be checked against
what it predicts. The stepping itself is `shadow.world.engine_model`; this module serves
it: one uvicorn server per worker (and, if asked, one data-parallel front serving every
engine, as one vLLM server with `--data-parallel-size G` does), its requests submitted to
the model and streamed as the model steps them.

The bytes are vLLM 0.32's (`shadow.world.vllm_wire`): ids from `X-Request-Id`, the chat
role chunk, usage chunks, error chunks, `n > 1`, every finish reason (the requests'
`vllm_xargs` controls of `shadow.world.emulator_request`). By default a chunk carries
one token, as the world's tap (which counts chunks) still needs; `stream_interval`,
`merge_outputs` and `split_utf8_every` turn on the multi-token and empty-text chunks of a
real server. The HTTP layer is a bare ASGI app (no framework): it writes hundreds of
concurrent streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shadow.replay.workload import StepModel
from shadow.world import vllm_wire as wire
from shadow.world.emulator_request import Ask, BadRequest, header, parse, pinned_rank
from shadow.world.engine_metrics import EngineMeter, FleetPage
from shadow.world.engine_model import (
    CANCELLED,
    DONE,
    DROPPED,
    FAILED,
    EngineRequest,
    EngineWorker,
    EventSink,
    SteppingFleet,
    wait_any,
)

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DIGESTS = 200_000  # oldest digests are forgotten past this (a demo runs for hours)

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
_JSON_HEADERS = [(b"content-type", b"application/json")]


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handlers alone: the fleet runs inside
    someone else's process (the service's demo, a test), G servers at once."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(eq=False)
class _WorkerServer:
    """The HTTP side of one server: its uvicorn server and address."""

    server: QuietServer
    task: asyncio.Task[None]
    url: str


class EmulatedFleet(SteppingFleet):
    """`workers` emulated decode workers behind one barrier, each its own HTTP server.

    `start()` / `stop()` inside a running event loop; `worker_urls[g]` is worker `str(g)`
    (its `/metrics` shows `engine="g"`); with `dp_front=True`, `dp_url` serves every
    worker as one vLLM server with data parallelism does (one `/metrics` page for all
    engines; `X-data-parallel-rank` pins a rank, else vLLM's balancer picks the engine
    with the lowest `4 * waiting + running`).
    `sent_digests[request_id]` is the SHA-256 of the exact response body a worker wrote
    (request_id: the `x-request-id` header, else the response id), so an end-to-end test
    can prove proxies in between changed no byte. The sink, if any, is started and closed
    by its owner; the fleet only `put`s `engine_step` events into it.

    Stream shapes, off by default here (the emulated world turns them on): `stream_interval` k
    sends a choice's tokens k at a time after its first (vLLM's `--stream-interval`);
    `merge_outputs` sends every token a lagging stream has not yet sent in one chunk (what
    vLLM's API server does when it falls behind the engine); `split_utf8_every` k >= 2
    makes every k-th token end mid-character and stream as `""`; `stream_lag_s` makes
    each stream pause that long after each write, as a busy API server does (with
    `merge_outputs`, its chunks then carry several tokens).
    """

    def __init__(
        self,
        workers: int,
        batch: int,
        *,
        step_model: StepModel | None = None,
        time_scale: float = 1.0,
        model_name: str = "emulated-model",
        host: str = "127.0.0.1",
        sink: EventSink | None = None,
        kv_capacity_tokens: int = 2_000_000,
        stream_interval: int = 1,
        merge_outputs: bool = False,
        split_utf8_every: int = 0,
        dp_front: bool = False,
        stream_lag_s: float = 0.0,
    ) -> None:
        super().__init__(workers, batch, step_model=step_model, time_scale=time_scale, sink=sink)
        if kv_capacity_tokens < 1:
            raise ValueError("kv_capacity_tokens must be >= 1")
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        if split_utf8_every < 0 or split_utf8_every == 1:
            raise ValueError(f"split_utf8_every must be 0 (off) or >= 2, got {split_utf8_every}")
        self.model_name = model_name
        self.host = host
        self.kv_capacity_tokens = kv_capacity_tokens
        self.stream_interval = stream_interval
        self.merge_outputs = merge_outputs
        self.split_utf8_every = split_utf8_every
        self.dp_front = dp_front
        if stream_lag_s < 0:
            raise ValueError(f"stream_lag_s must be >= 0, got {stream_lag_s}")
        self.stream_lag_s = stream_lag_s
        self.system_fingerprint = wire.fingerprint(workers if dp_front else 1)
        self.worker_urls: list[str] = []
        self.dp_url: str | None = None
        self.sent_digests: dict[str, str] = {}
        self._servers: list[_WorkerServer] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    # ----------------------------------------------------------------- lifecycle

    async def _serve(self, app: _WorkerApp) -> _WorkerServer:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        sock.listen(2048)
        sock.setblocking(False)
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            host=self.host,
            port=port,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan="off",
            interface="asgi3",
            backlog=2048,
            timeout_keep_alive=60,
        )
        server = QuietServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        host = f"[{self.host}]" if ":" in self.host else self.host
        served = _WorkerServer(server, task, f"http://{host}:{port}")
        self._servers.append(served)
        return served

    async def start(self) -> None:
        """Start one uvicorn server per worker (free loopback ports), the data-parallel
        front if asked, and the decode loop."""
        if self._loop_task is not None:
            raise RuntimeError("emulated fleet already started")
        for worker in self._workers:
            worker.meter = EngineMeter(self.model_name, str(worker.index))
        for worker in self._workers:
            await self._serve(_WorkerApp(self, [worker]))
        if self.dp_front:
            await self._serve(_WorkerApp(self, list(self._workers)))
        for index, served in enumerate(self._servers):
            while not served.server.started:
                if served.task.done():
                    served.task.result()  # raises the startup error
                    raise RuntimeError(f"emulated server {index} did not start")
                await asyncio.sleep(0.002)
        self.worker_urls = [s.url for s in self._servers[: len(self._workers)]]
        if self.dp_front:
            self.dp_url = self._servers[-1].url
        self._loop_task = asyncio.create_task(self.run(), name="emulated-decode-loop")

    async def stop(self) -> None:
        """Stop the decode loop and every server; streams still open are cut off."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for worker in self._workers:
            if worker.alive:
                self.kill_worker(worker.index)
        if self.dp_front and len(self._servers) > len(self._workers):
            self._servers[-1].server.should_exit = True
        tasks = [s.task for s in self._servers]
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2.0)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5.0)
            for task in pending:
                task.cancel()
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.warning("emulated worker server failed: %r", task.exception())

    def kill_worker(self, g: int) -> None:
        """Crash worker `g`: cut its connections mid-stream, drop its requests, stop
        stepping it. The rest of the fleet goes on (the data-parallel front too: its
        streams on `g` end without [DONE], new requests avoid `g`)."""
        if not self._workers[g].alive:
            return
        if g < len(self._servers):
            server = self._servers[g].server
            for listener in getattr(server, "servers", []):
                listener.close()
            for connection in list(server.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()  # RST: the client sees a broken stream
            server.should_exit = True
            server.force_exit = True
        self.crash(g)

    # ----------------------------------------------------------------- responses

    def _record_digest(self, key: str, digest: str) -> None:
        self.sent_digests.pop(key, None)
        self.sent_digests[key] = digest
        if len(self.sent_digests) > MAX_DIGESTS:
            del self.sent_digests[next(iter(self.sent_digests))]

    def _metrics_text(self, workers: list[EngineWorker]) -> bytes:
        meters = []
        for worker in workers:
            meter = worker.meter
            assert isinstance(meter, EngineMeter)
            meter.sample(
                len(worker.running),
                len(worker.waiting),
                min(1.0, worker.load() / self.kv_capacity_tokens),
            )
            meters.append(meter)
        if len(meters) == 1:
            return generate_latest(meters[0].registry)
        return generate_latest(FleetPage(m.registry for m in meters))  # type: ignore[arg-type]


class _WorkerApp:
    """The ASGI app of one server: vLLM's OpenAI-compatible subset, /metrics, /health.

    It serves `workers` (one, or every engine on the data-parallel front); `/metrics`
    shows only their engines."""

    def __init__(self, fleet: EmulatedFleet, workers: list[EngineWorker]) -> None:
        self.fleet = fleet
        self.workers = workers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                await self._respond(send, 405, wire.error_body(405, "MethodNotAllowed", method))
                return
            task = asyncio.current_task()
            assert task is not None
            self.fleet._handlers.add(task)
            try:
                await self._completion(scope, receive, send, chat=path.endswith("chat/completions"))
            finally:
                self.fleet._handlers.discard(task)
        elif path == "/metrics" and method == "GET":
            body = self.fleet._metrics_text(self.workers)
            await self._respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])
        elif path == "/health" and method == "GET":
            await self._respond(send, 200, b"", [])
        elif path == "/v1/models" and method == "GET":
            name = self.fleet.model_name
            model = {"id": name, "object": "model", "created": int(time.time())}
            model.update(owned_by="vllm", root=name, parent=None, permission=[])
            await self._respond(send, 200, wire.dumps({"object": "list", "data": [model]}))
        else:
            await self._respond(send, 404, wire.dumps({"detail": "Not Found"}))

    @staticmethod
    async def _respond(
        send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": _JSON_HEADERS if headers is None else headers,
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _pick(self, scope: Scope) -> EngineWorker:
        """The engine a request runs on: the one pinned by `X-data-parallel-rank`, else
        (on the front) vLLM's choice, the live engine with the lowest 4 * waiting + running."""
        rank = pinned_rank(header(scope, b"x-data-parallel-rank"), [w.index for w in self.workers])
        if rank is None:
            live = [w for w in self.workers if w.alive] or self.workers
            return min(live, key=lambda w: (4 * len(w.waiting) + len(w.running), w.index))
        return next(w for w in self.workers if w.index == rank)

    async def _completion(self, scope: Scope, receive: Receive, send: Send, *, chat: bool) -> None:
        fleet = self.fleet
        header_id = header(scope, b"x-request-id")
        base = header_id or uuid.uuid4().hex
        response_id = ("chatcmpl-" if chat else "cmpl-") + base
        engine_id = response_id if chat else f"{response_id}-0"  # vLLM's external id
        key = header_id or response_id
        digest = hashlib.sha256()
        reply_headers = list(_JSON_HEADERS)
        if header_id is not None:
            reply_headers.append((b"x-request-id", header_id.encode("latin-1")))
        try:
            body = bytearray()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                if len(body) > MAX_BODY_BYTES:
                    raise BadRequest("request body too large")
                if not message.get("more_body", False):
                    break
            try:
                payload = json.loads(body)
            except ValueError as error:
                raise BadRequest(f"request body is not valid JSON: {error}") from None
            ask = parse(payload, chat)
            worker = self._pick(scope)
        except BadRequest as error:
            body_bytes = wire.error_body(400, "BadRequestError", str(error), error.param)
            digest.update(body_bytes)
            fleet._record_digest(key, digest.hexdigest())
            await self._respond(send, 400, body_bytes, reply_headers)
            return
        if not worker.alive:
            body_bytes = wire.error_body(503, "ServiceUnavailable", "worker down")
            await self._respond(send, 503, body_bytes)
            return

        requests = [
            EngineRequest(
                engine_id,
                ask.prompt_tokens,
                ask.max_tokens,
                worker.index,
                output_tokens=ask.output_tokens,
                finish_reason=ask.finish_reason,
                fail_after=ask.fail_after,
            )
            for _ in range(ask.n)
        ]
        for request in requests:
            fleet.submit(request)
        watcher = asyncio.create_task(self._watch_disconnect(receive, requests))
        created = int(time.time())
        try:
            if ask.stream:
                shape = wire.StreamShape(
                    response_id, created, fleet.model_name, chat, ask.prompt_tokens,
                    ask.include_usage, ask.continuous_usage, fleet.system_fingerprint,
                )  # fmt: skip
                sse_headers = _SSE_HEADERS + reply_headers[1:]
                await self._stream(send, requests, ask, shape, digest, sse_headers)
            else:
                await self._unary(send, requests, ask, response_id, created, chat, digest,
                                  reply_headers)  # fmt: skip
        finally:
            watcher.cancel()
            for request in requests:
                fleet.release(request)
            fleet._record_digest(key, digest.hexdigest())

    async def _watch_disconnect(self, receive: Receive, requests: list[EngineRequest]) -> None:
        """The client hung up: stop generating and free the slots at once."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        for request in requests:
            self.fleet.release(request)

    def _text(self, request: EngineRequest, start: int, stop: int) -> str:
        count = request.output_tokens or request.max_tokens
        split, reason = self.fleet.split_utf8_every, request.finish_reason
        return "".join(wire.token_text(j, count, split, reason) for j in range(start, stop))

    async def _stream(
        self,
        send: Send,
        requests: list[EngineRequest],
        ask: Ask,
        shape: wire.StreamShape,
        digest: Any,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """SSE like vLLM: each engine output of each choice a `data:` chunk, then the
        usage chunk if asked, then [DONE]; an engine failure sends an error chunk."""
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        n = len(requests)
        sent = [0] * n
        closed = [False] * n
        role_pending = shape.chat
        interval, merge = self.fleet.stream_interval, self.fleet.merge_outputs
        tools = [wire.tool_call_id(r.finish_reason) for r in requests]
        while True:
            if any(r.state == FAILED for r in requests):
                tail = wire.STREAM_ERROR_LINE + wire.DONE_LINE
                break
            if any(r.state in (CANCELLED, DROPPED) for r in requests):
                return  # the client left or the worker died: no end of stream
            parts: list[bytes] = []
            for i, request in enumerate(requests):
                generated, done = request.generated, request.state == DONE
                for size in wire.chunk_sizes(sent[i], generated, done, interval, merge):
                    start, sent[i] = sent[i], sent[i] + size
                    last = done and sent[i] == generated
                    tool = tools[i]
                    parts.append(
                        shape.chunk(
                            i,
                            self._text(request, start, sent[i]),
                            sent[i],
                            request.finish_reason if last else None,
                            ask.stop_reason if last else None,
                            tool_call=None if tool is None else (tool if start == 0 else ""),
                        )
                    )
                    closed[i] = closed[i] or last
            if parts:
                if role_pending:
                    parts[:0] = [shape.role(i) for i in range(n)]
                    role_pending = False
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                digest.update(data)
                await send({"type": "http.response.body", "body": data, "more_body": True})
                if self.fleet.stream_lag_s:
                    await asyncio.sleep(self.fleet.stream_lag_s)
                continue
            if all(closed):
                tail = wire.DONE_LINE
                if ask.include_usage:
                    tail = shape.usage_chunk(sum(r.generated for r in requests)) + tail
                break
            await wait_any(requests)
        digest.update(tail)
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _unary(
        self,
        send: Send,
        requests: list[EngineRequest],
        ask: Ask,
        response_id: str,
        created: int,
        chat: bool,
        digest: Any,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """Non-streaming: the requests still decode step by step; answer when all are done
        (a 500 if the engine failed one, nothing if the client left or the worker died)."""
        while not all(r.ended for r in requests):
            await wait_any([r for r in requests if not r.ended])
        if any(r.state == FAILED for r in requests):
            body = wire.error_body(500, "InternalServerError", "Internal server error")
            digest.update(body)
            await self._respond(send, 500, body, headers)
            return
        if any(r.state != DONE for r in requests):
            return
        choices = [
            wire.Choice(
                self._text(r, 0, r.generated),
                r.generated,
                r.finish_reason,
                ask.stop_reason,
                wire.tool_call_id(r.finish_reason),
            )
            for r in requests
        ]
        body = wire.unary_body(
            response_id, created, self.fleet.model_name, chat, ask.prompt_tokens, choices,
            self.fleet.system_fingerprint,
        )  # fmt: skip
        digest.update(body)
        await self._respond(send, 200, body, headers)
