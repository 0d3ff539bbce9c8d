"""An emulated vllm-ascend data-parallel decode fleet: real HTTP servers on loopback.

The demo and the end-to-end tests need a fleet that speaks vLLM's wire format (OpenAI
completions and chat, SSE streaming, vLLM-named Prometheus metrics) and steps the way the
replay engine assumes (BALANCEROUTE.md, "The setting"), so that what the shadow service
observes can be checked against what it predicts:

- each worker runs at most `batch` requests and queues the rest FIFO;
- ONE loop steps the whole fleet behind a barrier: before a step, waiting requests are
  admitted into free slots; the step takes `T = step_model.step_ms(max_g L_g) / time_scale`
  with `L_g = sum over running (prompt_tokens + generated)`; then every running request
  generates one token, and those that reached `max_tokens` finish and free their slots;
- after each step every live worker reports an `engine_step` event to the optional sink.

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
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shadow.replay.workload import StepModel

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DEFAULT_MAX_TOKENS = 16
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DIGESTS = 200_000  # oldest digests are forgotten past this (a demo runs for hours)
MAX_LAG_S = 0.0008  # the most a step is shortened to make up for late timer wake-ups
# vLLM's buckets for inter-token latency.
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort")

_WAITING, _RUNNING, _DONE, _CANCELLED, _DROPPED = range(5)
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
_JSON_HEADERS = [(b"content-type", b"application/json")]
_DONE_LINE = b"data: [DONE]\n\n"


class EventSink(Protocol):
    """What the fleet needs of a sink (`shadow.connectors.sink.HttpEventSink` is one)."""

    def put(self, event: dict[str, Any]) -> None: ...


def _dumps(value: Any) -> bytes:
    """Compact JSON, the way vLLM's pydantic models serialise."""
    return json.dumps(value, separators=(",", ":")).encode()


class _BadRequest(Exception):
    pass


@dataclass(eq=False)
class _Request:
    """One request on one worker; the decode loop advances it, its handler streams it."""

    key: str
    prompt_tokens: int
    max_tokens: int
    worker: int
    generated: int = 0
    state: int = _WAITING
    waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Sleep until the decode loop (or a cancel or kill) changes this request."""
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handlers alone: the fleet runs inside
    someone else's process (the service's demo, a test), G servers at once."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class _Metrics:
    """One worker's vLLM-named metrics, in its own registry."""

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


@dataclass(eq=False)
class _Worker:
    index: int
    running: dict[_Request, None] = field(default_factory=dict)  # insertion-ordered set
    waiting: deque[_Request] = field(default_factory=deque)
    alive: bool = True
    server: QuietServer | None = None
    task: asyncio.Task[None] | None = None
    url: str = ""
    metrics: _Metrics | None = None

    def load(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self.running)


class EmulatedFleet:
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
        if workers < 1 or batch < 1:
            raise ValueError("an emulated fleet needs workers >= 1 and batch >= 1")
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if kv_capacity_tokens < 1:
            raise ValueError("kv_capacity_tokens must be >= 1")
        self.batch = batch
        self.step_model = step_model or StepModel()
        self.time_scale = time_scale
        self.model_name = model_name
        self.host = host
        self.sink = sink
        self.kv_capacity_tokens = kv_capacity_tokens
        self.worker_urls: list[str] = []
        self.sent_digests: dict[str, str] = {}
        self.cancelled = 0  # requests whose client went away before they finished
        self.completed = 0
        self.steps = 0
        self._workers = [_Worker(g) for g in range(workers)]
        self._arrival: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._lag_s = 0.0  # how late sleeps wake up, subtracted from the next sleep

    # ----------------------------------------------------------------- lifecycle

    @property
    def workers(self) -> int:
        return len(self._workers)

    async def start(self) -> None:
        """Start one uvicorn server per worker (free loopback ports) and the decode loop."""
        if self._loop_task is not None:
            raise RuntimeError("emulated fleet already started")
        self._arrival = asyncio.Event()
        for worker in self._workers:
            worker.metrics = _Metrics.create(self.model_name, str(worker.index))
            sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
            sock.listen(2048)
            sock.setblocking(False)
            port = sock.getsockname()[1]
            config = uvicorn.Config(
                _WorkerApp(self, worker),
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
            worker.server = QuietServer(config)
            worker.task = asyncio.create_task(worker.server.serve(sockets=[sock]))
            host = f"[{self.host}]" if ":" in self.host else self.host
            worker.url = f"http://{host}:{port}"
        for worker in self._workers:
            assert worker.server is not None and worker.task is not None
            while not worker.server.started:
                if worker.task.done():
                    worker.task.result()  # raises the startup error
                    raise RuntimeError(f"emulated worker {worker.index} did not start")
                await asyncio.sleep(0.002)
        self.worker_urls = [w.url for w in self._workers]
        self._loop_task = asyncio.create_task(self._decode_loop(), name="emulated-decode-loop")

    async def stop(self) -> None:
        """Stop the decode loop and every server; streams still open are cut off."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for worker in self._workers:
            if worker.alive:
                self.kill_worker(worker.index)
        tasks = [w.task for w in self._workers if w.task is not None]
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
        worker = self._workers[g]
        if not worker.alive:
            return
        worker.alive = False
        server = worker.server
        if server is not None:
            for listener in getattr(server, "servers", []):
                listener.close()
            for connection in list(server.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()  # RST: the client sees a broken stream
            server.should_exit = True
            server.force_exit = True
        dropped = [*worker.running, *worker.waiting]
        worker.running.clear()
        worker.waiting.clear()
        for request in dropped:
            request.state = _DROPPED
            request.wake()

    # ----------------------------------------------------------------- accessors

    def running(self, g: int) -> int:
        return len(self._workers[g].running)

    def waiting(self, g: int) -> int:
        return len(self._workers[g].waiting)

    def alive(self, g: int) -> bool:
        return self._workers[g].alive

    def load(self, g: int) -> int:
        """`L_g` now: KV tokens of worker g's running requests."""
        return self._workers[g].load()

    # ----------------------------------------------------------------- requests

    def _submit(self, request: _Request) -> None:
        self._workers[request.worker].waiting.append(request)
        assert self._arrival is not None
        self._arrival.set()

    def _release(self, request: _Request) -> None:
        """The handler is done with `request`; if it had not finished, the client left."""
        if request.state not in (_WAITING, _RUNNING):
            return
        worker = self._workers[request.worker]
        if request.state == _RUNNING:
            worker.running.pop(request, None)
        else:
            with contextlib.suppress(ValueError):
                worker.waiting.remove(request)
        request.state = _CANCELLED
        request.wake()
        self.cancelled += 1
        if worker.metrics is not None:
            worker.metrics.success["abort"].inc()

    def _record_digest(self, key: str, digest: str) -> None:
        self.sent_digests.pop(key, None)
        self.sent_digests[key] = digest
        if len(self.sent_digests) > MAX_DIGESTS:
            del self.sent_digests[next(iter(self.sent_digests))]

    # ----------------------------------------------------------------- decode loop

    async def _decode_loop(self) -> None:
        """Barrier-synchronised steps of the whole fleet (the replay engine's semantics)."""
        assert self._arrival is not None
        arrival = self._arrival
        workers = self._workers
        batch = self.batch
        clock = time.perf_counter
        try:
            while True:
                live = [w for w in workers if w.alive]
                for worker in live:
                    running, waiting = worker.running, worker.waiting
                    metrics = worker.metrics
                    while waiting and len(running) < batch:
                        request = waiting.popleft()
                        request.state = _RUNNING
                        running[request] = None
                        if metrics is not None:
                            metrics.prompt_tokens.inc(request.prompt_tokens)
                if not any(w.running for w in live):
                    arrival.clear()
                    if not any(w.waiting for w in live):
                        await arrival.wait()
                    continue
                loads = [w.load() for w in live]
                counts = [len(w.running) for w in live]
                queued = [len(w.waiting) for w in live]
                target_s = self.step_model.step_ms(max(loads)) / self.time_scale / 1000.0
                start = clock()
                planned = max(0.0, target_s - self._lag_s)
                await asyncio.sleep(planned)
                end = clock()
                duration_s = end - start
                # The event loop's timers wake up to 1 ms late (epoll's resolution): learn the
                # mean lateness and sleep that much less, but never more than MAX_LAG_S, so a
                # busy spell does not teach it to cut later steps short.
                late = min(MAX_LAG_S, max(0.0, duration_s - planned))
                self._lag_s = min(0.5 * target_s, 0.9 * self._lag_s + 0.1 * late)
                self._finish_step(live, loads, counts, queued, duration_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("emulated decode loop failed")
            raise

    def _finish_step(
        self,
        live: list[_Worker],
        loads: list[int],
        counts: list[int],
        queued: list[int],
        duration_s: float,
    ) -> None:
        """Every running request of a live worker gets one token; finished ones leave."""
        step = self.steps
        self.steps += 1
        now = time.time()
        duration_ms = duration_s * 1000.0
        sink = self.sink
        for worker, load, count, waiting in zip(live, loads, counts, queued, strict=True):
            if not worker.alive:  # killed during the step
                continue
            metrics = worker.metrics
            finished: list[_Request] = []
            produced = 0
            itl_samples = 0
            for request in worker.running:
                if request.generated:
                    itl_samples += 1
                request.generated += 1
                produced += 1
                if request.generated >= request.max_tokens:
                    request.state = _DONE
                    finished.append(request)
                request.wake()
            for request in finished:
                del worker.running[request]
            self.completed += len(finished)
            if metrics is not None:
                if produced:
                    metrics.generation_tokens.inc(produced)
                if finished:
                    metrics.success["length"].inc(len(finished))
                observe = metrics.itl.observe
                for _ in range(itl_samples):
                    observe(duration_s)
            if sink is not None:
                sink.put(
                    {
                        "type": "engine_step",
                        "ts": now,
                        "worker": str(worker.index),
                        "step": step,
                        "duration_ms": duration_ms,
                        "running": count,
                        "kv_tokens": load,
                        "waiting": waiting,
                    }
                )

    # ----------------------------------------------------------------- metrics

    def _metrics_text(self, worker: _Worker) -> bytes:
        metrics = worker.metrics
        assert metrics is not None
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

    def __init__(self, fleet: EmulatedFleet, worker: _Worker) -> None:
        self.fleet = fleet
        self.worker = worker
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
            body = self.fleet._metrics_text(self.worker)
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

        request = _Request(key, prompt_tokens, max_tokens, self.worker.index)
        fleet._submit(request)
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
            fleet._release(request)
            fleet._record_digest(key, digest.hexdigest())

    async def _watch_disconnect(self, receive: Receive, request: _Request) -> None:
        """The client hung up: stop generating and free the slot at once."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        self.fleet._release(request)

    async def _stream(
        self,
        send: Send,
        request: _Request,
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
            if state == _DONE:
                break
            if state in (_CANCELLED, _DROPPED):
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
        request: _Request,
        response_id: str,
        chat: bool,
        digest: Any,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """Non-streaming: the request still decodes step by step; answer when it is done."""
        while request.state not in (_DONE, _CANCELLED, _DROPPED):
            await request.wait()
        if request.state != _DONE:
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
