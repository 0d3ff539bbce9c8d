"""The tap's proxy: forwards requests to an engine, passes the answer back byte for byte,
and tells the shadow service what happened.

Per request on `/v1/completions` or `/v1/chat/completions` (POST): `ready` (unless the
router announces it) and `dispatch` before the request leaves, cumulative `progress` at
most every `progress_interval_s`, and `finish` per choice. With `n > 1` the engine runs n
requests, so the shadow sees n: `<id>#0` .. `<id>#<n-1>`. The id is the engine's own
(`cmpl-<X-Request-Id>-0`, `chatcmpl-<X-Request-Id>`; `request_ids = "header"`: the
X-Request-Id itself); the tap sets `X-Request-Id` when the client did not, so the id is
known before the first byte. Tokens are counted by `StreamAccountant` (exact from usage,
else a flagged lower-bound estimate).

What it changes: nothing in the response; in the request only `X-Request-Id` (when
absent) and `X-data-parallel-rank` (when the engine has a `dp_rank`). Chunks go to the
client as they arrive (accounting runs after the hand-off), events go through the
non-blocking `HttpEventSink`. A client that leaves closes the upstream request
(`cancelled`); an upstream failure ends the request in `error` (and, once the answer has
started, cuts the client's connection). Neither marks the worker
down: one request says nothing about an engine's health, its metrics do. Other paths are
proxied without events.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import time
import uuid
from typing import Any

import httpx
import msgspec

from shadow.connectors.openai_stream import StreamAccountant, Update
from shadow.connectors.sink import HttpEventSink
from shadow.connectors.tap.config import EngineConfig, TapConfig
from shadow.connectors.tap.listener import Exchange, Handler
from shadow.connectors.tap.metrics import CONTENT_TYPE, TapMetrics
from shadow.connectors.tap.upstream import UpstreamClient, UpstreamError, UpstreamResponse
from shadow.events import (
    DispatchEvent,
    Event,
    FinishEvent,
    ProgressEvent,
    ReadyEvent,
    RouterView,
    WorkerEvent,
    event_to_json,
)

#: Headers a proxy must not forward (RFC 9110's connection-specific ones; host, which the
#: client sets for the upstream; the request's length, which the client recomputes; and
#: `expect`: the tap has read the whole body before it forwards the request, so the
#: engine's `100 Continue` would only be a second answer).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
     "trailer", "transfer-encoding", "upgrade", "content-length", "host", "expect"}
)  # fmt: skip
#: response headers not forwarded (the length is kept: the raw body is passed unchanged)
_RESPONSE_DROP = frozenset(HOP_BY_HOP - {"content-length"})
GENERATION_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
_JSON = [(b"content-type", b"application/json")]
_FIELDS = {k: {f.name for f in msgspec.structs.fields(k)} for k in (FinishEvent, ProgressEvent)}


#: idle upstream connections are dropped after this: below the engines' own keep-alive
#: (uvicorn's, so vLLM's, is 5 s), so the tap never sends a request on a connection the
#: engine is closing at that moment (answered 502)
KEEPALIVE_EXPIRY_S = 2.0


def proxy_client() -> httpx.AsyncClient:
    """An httpx client shaped like the tap's upstream one (no read timeout, a connection
    per stream in flight), for the emulated world's router, which is not on the tap's
    per-chunk path."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=5.0),
        limits=httpx.Limits(
            max_connections=2000, max_keepalive_connections=500,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        ),
    )  # fmt: skip


def _words(content: object) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):  # chat content as parts: count the text parts
        return sum(_words(p.get("text", "")) for p in content if isinstance(p, dict))
    return 0


def prompt_tokens_of(body: dict) -> int:
    """Prompt length as the tap can tell without a tokenizer: token ids when the prompt
    is ids, else words (the emulator counts the same way)."""
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


@functools.cache
def _defaults(kind: type) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (f.name, f.default)
        for f in msgspec.structs.fields(kind)
        if f.default is not msgspec.NODEFAULT
    )


def event_fields(event: Event) -> dict[str, Any]:
    """The event as the sink takes it: JSON-ready, defaulted fields left out (the sink
    stamps fleet, source and seq)."""
    data = event_to_json(event)
    for name, default in _defaults(type(event)):
        if name in data and data[name] == default:
            del data[name]
    return data


def _optional(kind: type, **values: Any) -> dict[str, Any]:
    """The fields of `values` that `kind` has (the event contract grows them)."""
    return {k: v for k, v in values.items() if k in _FIELDS[kind] and v is not None}


def _n_of(body: dict) -> int:
    n = body.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1024 else 1


class _Request:
    """One generation request's ids and what has been reported of it."""

    __slots__ = (
        "accountant", "estimated", "exact", "finished", "ids", "last_report", "reported",
        "tokens",
    )  # fmt: skip

    def __init__(self, ids: list[str], accountant: StreamAccountant) -> None:
        self.ids = ids
        self.accountant = accountant
        self.reported = [0] * len(ids)
        self.tokens = [0] * len(ids)
        self.finished = [False] * len(ids)
        #: finished with an estimate: a later exact count is sent as a correction
        self.estimated = [False] * len(ids)
        #: the choice's count so far is exact (the accountant's last update said so)
        self.exact = [False] * len(ids)
        self.last_report = 0.0


class TapProxy:
    """The proxy for one tap config; `handler(listener)` is what a listener serves (an
    engine's own, or None for the shared one; `listener.listen`)."""

    def __init__(
        self,
        config: TapConfig,
        sink: HttpEventSink,
        *,
        client: UpstreamClient | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.metrics = TapMetrics(lambda: (sink.sent, sink.dropped))
        self._client = client
        self._own_client = client is None
        self.engines = {e.worker: e for e in config.engines}
        self._prefixes = sorted(
            ((e.path_prefix, e) for e in config.engines if e.path_prefix),
            key=lambda item: -len(item[0]),
        )
        self._headers = {e.header: e for e in config.engines if e.header is not None}
        self._route_header = config.route_header.lower().encode("latin-1")

    async def start(self) -> None:
        """The client, and a `worker` up event per engine with a capacity."""
        if self._client is None:
            self._client = UpstreamClient(keepalive_expiry_s=KEEPALIVE_EXPIRY_S)
        now = time.time()
        for engine in self.config.engines:
            if engine.capacity is not None:
                up = WorkerEvent(ts=now, worker=engine.worker, capacity=engine.capacity)
                self.sink.put(event_fields(up))

    async def stop(self) -> None:
        if self._own_client and self._client is not None:
            await self._client.aclose()

    def handler(self, engine: EngineConfig | None = None) -> Handler:
        """What a listener serves: an engine's own (`engine`), or the shared one (None)."""

        async def handle(exchange: Exchange) -> None:
            await self._handle(engine, exchange)

        return handle

    # ------------------------------------------------------------------ routing

    def _route(
        self, engine: EngineConfig | None, exchange: Exchange
    ) -> tuple[EngineConfig, str, str] | None:
        """The engine, the path it is asked for (decoded, what the tap reads) and the same
        path as the client wrote it (percent-encoded, what the tap forwards: a decoded
        space or `?` would change the request)."""
        path = exchange.path
        wire = exchange.raw_path.decode("latin-1")
        if engine is not None:
            return engine, path, wire
        for prefix, candidate in self._prefixes:
            if path == prefix or path.startswith(prefix + "/"):
                return candidate, path[len(prefix) :] or "/", _strip_prefix(wire, prefix) or "/"
        for key, value in exchange.headers:
            if key == self._route_header:
                found = self._headers.get(value.decode("latin-1"))
                return None if found is None else (found, path, wire)
        return None

    async def _handle(self, listener: EngineConfig | None, exchange: Exchange) -> None:
        if listener is None and exchange.path == "/metrics" and exchange.method == "GET":
            exchange.respond(200, self.metrics.render(),
                             [(b"content-type", CONTENT_TYPE.encode())])  # fmt: skip
            return
        routed = self._route(listener, exchange)
        if routed is None:
            message = (f"no engine for {exchange.path}: match a path_prefix or set "
                       f"{self.config.route_header} to an engine's header value")  # fmt: skip
            exchange.respond(404, json.dumps({"error": message}).encode(), _JSON)
            return
        engine, path, wire = routed
        body = exchange.body
        headers = [(k, v) for k, v in exchange.headers if k.decode("latin-1") not in HOP_BY_HOP]
        endpoint = GENERATION_PATHS.get(path) if exchange.method == "POST" else None
        parsed: dict | None = None
        if endpoint is not None:
            with contextlib.suppress(ValueError):
                candidate = json.loads(body) if body else None
                parsed = candidate if isinstance(candidate, dict) else None
        self.metrics.requests.labels(engine.worker, endpoint or "other").inc()
        state: _Request | None = None
        if parsed is not None:
            header_id = _header(headers, b"x-request-id")
            if header_id is None:
                header_id = uuid.uuid4().hex
                headers.append((b"x-request-id", header_id.encode()))
            n = _n_of(parsed)
            accountant = StreamAccountant(
                endpoint=endpoint or "completions", n=n, stream=bool(parsed.get("stream", False))
            )
            state = _Request(self._ids(endpoint or "", header_id, n), accountant)
            self._announce(engine, state, parsed, headers)
        if engine.dp_rank is not None:
            headers = [(k, v) for k, v in headers if k != b"x-data-parallel-rank"]
            headers.append((b"x-data-parallel-rank", str(engine.dp_rank).encode()))
        query = exchange.query
        url = engine.upstream + wire + ("?" + query.decode("latin-1") if query else "")
        assert self._client is not None
        try:
            upstream = await self._client.send(exchange.method, url, headers, body)
        except asyncio.CancelledError:  # the tap is stopping: the request never got an answer
            if state is not None:
                self._close(state, client_gone=True)
            raise
        except UpstreamError as error:
            self.metrics.upstream_errors.labels(engine.worker).inc()
            if state is not None:
                self._close(state, upstream_error=str(error))
            reason = f"engine {engine.worker} unreachable: {error}"
            exchange.respond(502, json.dumps({"error": reason}).encode(), _JSON)
            return
        await self._relay(engine, upstream, state, exchange)

    def _ids(self, endpoint: str, header_id: str, n: int) -> list[str]:
        if self.config.request_ids == "header":
            base = header_id
        elif endpoint == "chat":
            base = f"chatcmpl-{header_id}"
        else:
            base = f"cmpl-{header_id}-0"
        return [base] if n == 1 else [f"{base}#{i}" for i in range(n)]

    # ------------------------------------------------------------------ relaying

    async def _relay(
        self,
        engine: EngineConfig,
        upstream: UpstreamResponse,
        state: _Request | None,
        exchange: Exchange,
    ) -> None:
        """Pass the body through as it arrives, from the engine connection's own callback
        (accounting after the hand-off), until it ends or the client leaves; the first
        to happen decides how the request ended. A body that breaks off cuts the
        client's connection: a proxy must not end a truncated answer as a whole one."""
        headers = [
            (k.lower(), v)
            for k, v in upstream.raw_headers
            if k.decode("latin-1").lower() not in _RESPONSE_DROP
        ]
        exchange.start(upstream.status_code, headers)
        passed = self.metrics.passed.setdefault(engine.worker, [0, 0])
        latency = self.metrics.added_latency.observe
        clock = time.perf_counter
        write = exchange.write
        apply = self._apply

        def relay(chunk: bytes) -> None:
            arrived = clock()
            write(chunk)
            latency(clock() - arrived)
            passed[0] += 1
            passed[1] += len(chunk)
            if state is not None:
                apply(state, state.accountant.feed(chunk))

        exchange.on_flow(upstream.pause, upstream.resume)
        body = upstream.stream_to(relay)
        error: str | None = None
        client_left = False
        try:
            await asyncio.wait((body, exchange.gone), return_when=asyncio.FIRST_COMPLETED)
            client_left = not body.done()
            if not client_left:
                failure = body.exception()
                if failure is None:
                    exchange.end()
                else:
                    error = str(failure)
                    self.metrics.upstream_errors.labels(engine.worker).inc()
                    exchange.abort()
        finally:
            if not body.done():
                body.cancel()
            with contextlib.suppress(Exception):  # the engine's connection is let go
                await upstream.aclose()
        if state is None:
            return
        if client_left:
            self._close(state, client_gone=True)
            return
        if error is None and upstream.status_code >= 400:
            error = f"status {upstream.status_code}"
        self._close(state, upstream_error=error)

    # ------------------------------------------------------------------ events

    def _announce(
        self, engine: EngineConfig, state: _Request, body: dict, headers: list[tuple[bytes, bytes]]
    ) -> None:
        now = time.time()
        router_view = None
        view = _header(headers, b"x-router-view")
        if view:
            with contextlib.suppress(msgspec.MsgspecError):  # a view that is not one: left out
                router_view = msgspec.json.decode(view, type=dict[str, RouterView])
        policy = _header(headers, b"x-router-policy") or self.config.policy
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            max_tokens = None
        tokens, key = prompt_tokens_of(body), prompt_hash_of(body)
        # the router announced the request itself, but not the n - 1 extra ones
        ready = self.config.emit_ready or len(state.ids) > 1
        for request_id in state.ids:
            if ready:
                self.sink.put(event_fields(ReadyEvent(
                    ts=now, request_id=request_id, prompt_tokens=tokens, prompt_hash=key,
                    max_tokens=max_tokens,
                )))  # fmt: skip
            self.sink.put(event_fields(DispatchEvent(
                ts=now, request_id=request_id, worker=engine.worker, policy=policy,
                router_view=router_view,
            )))  # fmt: skip

    def _apply(self, state: _Request, updates: list[Update]) -> None:
        if not updates:
            return
        for u in updates:
            if not 0 <= u.choice < len(state.ids):
                continue
            if state.finished[u.choice]:
                if u.finished and not u.estimated and state.estimated[u.choice]:
                    self._correct(state, u)
                continue
            if u.tokens >= state.tokens[u.choice]:
                state.tokens[u.choice] = u.tokens
                state.exact[u.choice] = not u.estimated
            if u.finished:
                self._finish(state, u.choice, u.tokens, u.estimated, u.reason, u.raw_reason)
        now = time.monotonic()
        if now - state.last_report >= self.config.progress_interval_s:
            state.last_report = now
            self._progress(state)

    def _progress(self, state: _Request) -> None:
        ts = time.time()
        for i in range(len(state.ids)):
            if not state.finished[i] and state.tokens[i] > state.reported[i]:
                self._progress_event(state, i, state.tokens[i], not state.exact[i], ts)

    def _progress_event(
        self, state: _Request, i: int, generated: int, estimated: bool, ts: float
    ) -> None:
        state.reported[i] = generated
        extra = _optional(ProgressEvent, estimated=estimated)
        event = ProgressEvent(ts=ts, request_id=state.ids[i], generated=generated, **extra)
        self.sink.put(event_fields(event))

    def _finish(
        self,
        state: _Request,
        i: int,
        tokens: int,
        estimated: bool,
        reason: str | None,
        raw_reason: str | None,
    ) -> None:
        """The choice's finish, after a last progress up to its count (progress then
        equals the count, never more: an estimate is a lower bound)."""
        if state.finished[i]:
            return
        ts = time.time()
        if tokens > state.reported[i]:
            self._progress_event(state, i, tokens, estimated, ts)
        state.finished[i] = True
        state.estimated[i] = estimated
        if estimated:
            self.metrics.estimates.inc()
        extra = _optional(FinishEvent, estimated=estimated, raw_reason=raw_reason)
        finish = FinishEvent(ts=ts, request_id=state.ids[i], output_tokens=tokens,
                             reason=reason or "error", **extra)  # fmt: skip
        self.sink.put(event_fields(finish))

    def _correct(self, state: _Request, u: Update) -> None:
        """The exact count of a choice already finished with an estimate (n > 1: the
        usage comes after every choice's finish): the finish again, exact, which the
        service takes as a correction."""
        state.estimated[u.choice] = False
        extra = _optional(FinishEvent, estimated=False, raw_reason=u.raw_reason)
        finish = FinishEvent(ts=time.time(), request_id=state.ids[u.choice], output_tokens=u.tokens,
                             reason=u.reason or "error", **extra)  # fmt: skip
        self.sink.put(event_fields(finish))

    def _close(
        self,
        state: _Request,
        *,
        client_gone: bool = False,
        upstream_error: str | None = None,
    ) -> None:
        """End every choice still open: what the accountant says, except that a refused
        or broken request is an `error` (and a client gone, `cancelled`) whatever the
        body said; a choice it leaves open ends the same way."""
        forced = "cancelled" if client_gone else ("error" if upstream_error else None)
        for u in state.accountant.close(client_gone=client_gone, upstream_error=upstream_error):
            if not 0 <= u.choice < len(state.ids):
                continue
            if state.finished[u.choice]:
                if u.finished and not u.estimated and state.estimated[u.choice]:
                    self._correct(state, u)
            else:
                tokens = max(state.tokens[u.choice], u.tokens)
                keep = forced is None or u.reason in ("error", "cancelled")
                reason = u.reason if keep else forced
                self._finish(state, u.choice, tokens, u.estimated, reason, u.raw_reason)
        for i in range(len(state.ids)):
            if not state.finished[i]:
                self._finish(state, i, state.tokens[i], True, forced or "error", None)


def _strip_prefix(wire: str, prefix: str) -> str:
    """The encoded path less the route's prefix (matched on the decoded path: a prefix
    is plain, `/w0`, but the client may have encoded any of its characters)."""
    if wire.startswith(prefix):
        return wire[len(prefix) :]
    depth = prefix.count("/")  # the prefix's segments, however they were encoded
    parts = wire.split("/", depth + 1)
    return "/" + parts[depth + 1] if len(parts) > depth + 1 else ""


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
