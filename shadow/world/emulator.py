"""An emulated vllm-ascend data-parallel decode fleet: real HTTP servers on loopback.

The demo and the end-to-end tests need a fleet that speaks vLLM's wire format (OpenAI
completions and chat, SSE streaming, vLLM-named Prometheus metrics) and steps the way the
replay engine assumes, so that what the shadow service observes can be checked against
what it predicts. The stepping itself is `shadow.world.engine_model`; this module serves
it: one uvicorn server per worker, its requests submitted to the model and streamed token
by token as the model steps them.

Outputs are always exactly `max_tokens` tokens (" tok0", " tok1", ...; finish_reason
"length"), as with `ignore_eos`. The HTTP layer is a bare ASGI app (no framework) because
it writes a chunk per token for hundreds of concurrent streams.
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
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shadow.replay.workload import StepModel
from shadow.world.engine_model import (
    CANCELLED,
    DONE,
    DROPPED,
    EngineRequest,
    EngineWorker,
    EventSink,
    SteppingFleet,
)

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DEFAULT_MAX_TOKENS = 16
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DIGESTS = 200_000  # oldest digests are forgotten past this (a demo runs for hours)
# vLLM's buckets for inter-token latency.
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort")

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
_JSON_HEADERS = [(b"content-type", b"application/json")]
_DONE_LINE = b"data: [DONE]\n\n"


def _dumps(value: Any) -> bytes:
    """Compact JSON, the way vLLM's pydantic models serialise."""
    return json.dumps(value, separators=(",", ":")).encode()


class _BadRequest(Exception):
    pass


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handlers alone: the fleet runs inside
    someone else's process (the service's demo, a test), G servers at once."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class _Metrics:
    """One worker's vLLM-named metrics, in its own registry; the stepping model's meter."""

    registry: CollectorRegistry
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    generation_tokens: Counter
    prompt_tokens: Counter
    success: dict[str, Counter]
    itl: Histogram

    @classmethod
    def create(cls, model_name: str, engine: str) -> _Metrics:
        registry = CollectorRegistry(auto_describe=False)
        names = ["model_name", "engine"]
        labels = (model_name, engine)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=registry).labels(*labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=registry).labels(*labels)

        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=registry,
        )
        itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            names,
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        return cls(
            registry=registry,
            running=gauge("vllm:num_requests_running", "Number of requests in model execution."),
            waiting=gauge("vllm:num_requests_waiting", "Number of requests waiting."),
            kv_usage=gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent."),
            generation_tokens=counter(
                "vllm:generation_tokens", "Number of generation tokens processed."
            ),
            prompt_tokens=counter("vllm:prompt_tokens", "Number of prefill tokens processed."),
            success={r: success.labels(*labels, r) for r in FINISHED_REASONS},
            itl=itl.labels(*labels),
        )

    def admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)

    def stepped(self, produced: int, finished: int, itl_samples: int, duration_s: float) -> None:
        if produced:
            self.generation_tokens.inc(produced)
        if finished:
            self.success["length"].inc(finished)
        observe = self.itl.observe
        for _ in range(itl_samples):
            observe(duration_s)

    def aborted(self) -> None:
        self.success["abort"].inc()


@dataclass(eq=False)
class _WorkerServer:
    """The HTTP side of one worker: its uvicorn server, address and metrics."""

    server: QuietServer
    task: asyncio.Task[None]
    url: str
    metrics: _Metrics


class EmulatedFleet(SteppingFleet):
    """`workers` emulated decode workers behind one barrier, each its own HTTP server.

    `start()` / `stop()` inside a running event loop; `worker_urls[g]` is worker `str(g)`.
    `sent_digests[request_id]` is the SHA-256 of the exact response body a worker wrote
    (request_id: the `x-request-id` header, else the response id), so an end-to-end test
    can prove proxies in between changed no byte. The sink, if any, is started and closed
    by its owner; the fleet only `put`s `engine_step` events into it.
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
    ) -> None:
        super().__init__(workers, batch, step_model=step_model, time_scale=time_scale, sink=sink)
        if kv_capacity_tokens < 1:
            raise ValueError("kv_capacity_tokens must be >= 1")
        self.model_name = model_name
        self.host = host
        self.kv_capacity_tokens = kv_capacity_tokens
        self.worker_urls: list[str] = []
        self.sent_digests: dict[str, str] = {}
        self._servers: list[_WorkerServer] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start one uvicorn server per worker (free loopback ports) and the decode loop."""
        if self._loop_task is not None:
            raise RuntimeError("emulated fleet already started")
        for worker in self._workers:
            metrics = _Metrics.create(self.model_name, str(worker.index))
            worker.meter = metrics
            sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
            sock.listen(2048)
            sock.setblocking(False)
            port = sock.getsockname()[1]
            config = uvicorn.Config(
                _WorkerApp(self, worker, metrics),
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
            self._servers.append(_WorkerServer(server, task, f"http://{host}:{port}", metrics))
        for index, served in enumerate(self._servers):
            while not served.server.started:
                if served.task.done():
                    served.task.result()  # raises the startup error
                    raise RuntimeError(f"emulated worker {index} did not start")
                await asyncio.sleep(0.002)
        self.worker_urls = [s.url for s in self._servers]
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
        stepping it. The rest of the fleet goes on."""
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

    def _metrics_text(self, worker: EngineWorker, metrics: _Metrics) -> bytes:
        metrics.running.set(len(worker.running))
        metrics.waiting.set(len(worker.waiting))
        metrics.kv_usage.set(min(1.0, worker.load() / self.kv_capacity_tokens))
        return generate_latest(metrics.registry)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def _words(text: str) -> int:
    return len(text.split())


def _max_tokens(payload: dict[str, Any], chat: bool) -> int:
    value = payload.get("max_tokens")
    if value is None and chat:
        value = payload.get("max_completion_tokens")
    if value is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _BadRequest(f"max_tokens must be an integer >= 1, got {value!r}")
    return value


def _prompt_tokens(payload: dict[str, Any], chat: bool) -> int:
    """Token count of the prompt: ids are counted, text is counted in words."""
    if chat:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("messages must be a non-empty list")
        words = 0
        for message in messages:
            if not isinstance(message, dict):
                raise _BadRequest("each message must be an object")
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
    raise _BadRequest("prompt must be a string or a non-empty list of token ids (batch of one)")


def _error_body(status: int, kind: str, message: str) -> bytes:
    return _dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})


class _WorkerApp:
    """The ASGI app of one worker: vLLM's OpenAI-compatible subset, /metrics, /health."""

    def __init__(self, fleet: EmulatedFleet, worker: EngineWorker, metrics: _Metrics) -> None:
        self.fleet = fleet
        self.worker = worker
        self.metrics = metrics
        self.model_json = _dumps(fleet.model_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                await self._respond(send, 405, _error_body(405, "MethodNotAllowed", method))
                return
            task = asyncio.current_task()
            assert task is not None
            self.fleet._handlers.add(task)
            try:
                await self._completion(scope, receive, send, chat=path.endswith("chat/completions"))
            finally:
                self.fleet._handlers.discard(task)
        elif path == "/metrics" and method == "GET":
            body = self.fleet._metrics_text(self.worker, self.metrics)
            await self._respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])
        elif path == "/health" and method == "GET":
            await self._respond(send, 200, b"", [])
        elif path == "/v1/models" and method == "GET":
            body = {
                "object": "list",
                "data": [
                    {
                        "id": self.fleet.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": self.fleet.model_name,
                        "parent": None,
                        "permission": [],
                    }
                ],
            }
            await self._respond(send, 200, _dumps(body))
        else:
            await self._respond(send, 404, _dumps({"detail": "Not Found"}))

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

    async def _completion(self, scope: Scope, receive: Receive, send: Send, *, chat: bool) -> None:
        fleet = self.fleet
        header_id = _header(scope, b"x-request-id")
        response_id = ("chatcmpl-" if chat else "cmpl-") + (header_id or uuid.uuid4().hex)
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
                    raise _BadRequest("request body too large")
                if not message.get("more_body", False):
                    break
            try:
                payload = json.loads(body)
            except ValueError as error:
                raise _BadRequest(f"request body is not valid JSON: {error}") from None
            if not isinstance(payload, dict):
                raise _BadRequest("request body must be a JSON object")
            prompt_tokens = _prompt_tokens(payload, chat)
            max_tokens = _max_tokens(payload, chat)
            stream = bool(payload.get("stream", False))
            options = payload.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        except _BadRequest as error:
            body_bytes = _error_body(400, "BadRequestError", str(error))
            digest.update(body_bytes)
            fleet._record_digest(key, digest.hexdigest())
            await self._respond(send, 400, body_bytes, reply_headers)
            return
        if not self.worker.alive:
            await self._respond(send, 503, _error_body(503, "ServiceUnavailable", "worker down"))
            return

        request = EngineRequest(key, prompt_tokens, max_tokens, self.worker.index)
        fleet.submit(request)
        watcher = asyncio.create_task(self._watch_disconnect(receive, request))
        try:
            if stream:
                sse_headers = _SSE_HEADERS + reply_headers[1:]
                await self._stream(
                    send, request, response_id, chat, include_usage, digest, sse_headers
                )
            else:
                await self._unary(send, request, response_id, chat, digest, reply_headers)
        finally:
            watcher.cancel()
            fleet.release(request)
            fleet._record_digest(key, digest.hexdigest())

    async def _watch_disconnect(self, receive: Receive, request: EngineRequest) -> None:
        """The client hung up: stop generating and free the slot at once."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        self.fleet.release(request)

    async def _stream(
        self,
        send: Send,
        request: EngineRequest,
        response_id: str,
        chat: bool,
        include_usage: bool,
        digest: Any,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """SSE exactly like vLLM: one `data:` chunk per token, then usage, then [DONE]."""
        created = int(time.time())
        head = b'data: {"id":' + _dumps(response_id)
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        head += b',"object":"' + obj + b'","created":' + str(created).encode()
        head += b',"model":' + self.model_json
        if chat:
            prefix = head + b',"choices":[{"index":0,"delta":{"content":" tok'
            middle = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            final = b'"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
            role: bytes | None = head + (
                b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]}\n\n'
            )
        else:
            prefix = head + b',"choices":[{"index":0,"text":" tok'
            middle = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            final = b'","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
            role = None
        last = request.max_tokens - 1

        await send({"type": "http.response.start", "status": 200, "headers": headers})
        sent = 0
        while True:
            generated = request.generated
            if generated > sent:
                parts = [prefix + str(i).encode() + (final if i == last else middle)
                         for i in range(sent, generated)]  # fmt: skip
                if role is not None:
                    parts.insert(0, role)
                    role = None
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                digest.update(data)
                sent = generated
                await send({"type": "http.response.body", "body": data, "more_body": True})
                continue
            state = request.state
            if state == DONE:
                break
            if state in (CANCELLED, DROPPED):
                return  # the client left or the worker died: no end of stream
            await request.wait()
        tail = _DONE_LINE
        if include_usage:
            usage = {
                "id": response_id,
                "object": obj.decode(),
                "created": created,
                "model": self.fleet.model_name,
                "choices": [],
                "usage": {
                    "prompt_tokens": request.prompt_tokens,
                    "completion_tokens": request.generated,
                    "total_tokens": request.prompt_tokens + request.generated,
                },
            }
            tail = b"data: " + _dumps(usage) + b"\n\n" + _DONE_LINE
        digest.update(tail)
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _unary(
        self,
        send: Send,
        request: EngineRequest,
        response_id: str,
        chat: bool,
        digest: Any,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """Non-streaming: the request still decodes step by step; answer when it is done."""
        while request.state not in (DONE, CANCELLED, DROPPED):
            await request.wait()
        if request.state != DONE:
            return
        text = "".join(f" tok{i}" for i in range(request.generated))
        usage = {
            "prompt_tokens": request.prompt_tokens,
            "total_tokens": request.prompt_tokens + request.generated,
            "completion_tokens": request.generated,
        }
        choice: dict[str, Any]
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        body = _dumps(
            {
                "id": response_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.fleet.model_name,
                "choices": [choice],
                "usage": usage,
            }
        )
        digest.update(body)
        await self._respond(send, 200, body, headers)
