"""The tap's listeners: a small HTTP/1.1 server (an asyncio protocol and httptools' request
parser) that hands each request to the proxy as an `Exchange` and writes its answer.

Why not uvicorn and ASGI: the tap is held to a share of a core per chunk. Through ASGI a
chunk costs a wake-up of the relaying task, a message dict and the server's `send`
coroutine; here it is one `Exchange.write`, called from the engine connection's
`data_received` (`UpstreamResponse.stream_to`). Measured on a synthetic vLLM-shaped
upstream here, the relay alone (no token accounting) cost 44 us a chunk this way against
107-125 us for the whole tap through uvicorn, 59% of which was the interpreter (perf).

What it does and no more: keep-alive (idle connections closed after `IDLE_TIMEOUT_S`),
pipelined requests answered in order (reading paused while `MAX_QUEUED` wait), a request
whose bytes stop arriving for `STALLED_REQUEST_S` answered 408, `Expect: 100-continue`
answered, bodies up to `MAX_BODY` bytes (413 above), a malformed request answered 400
and the connection closed, answers framed by their `content-length` or else chunked
(HTTP/1.0: by the connection's end), no body for HEAD, 1xx, 204 and 304. A client that
leaves resolves its exchange's `gone`; a client that reads slower than the answer
arrives pauses the writer's source (`Exchange.on_flow`). Nothing is added to an answer
but its framing and, when the connection closes after it, `connection: close`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

import httptools

log = logging.getLogger(__name__)

#: a request body above this is refused (413): the tap reads it whole before forwarding
MAX_BODY = 64 << 20
#: an idle keep-alive connection is closed after this (uvicorn's setting the tap used)
IDLE_TIMEOUT_S = 120.0
#: requests read and waiting behind the answer in flight; at this many the tap reads no
#: more from the client until one is answered. The check runs as each request completes,
#: so what one read already brought is still queued: a pipelining client is held to this
#: many requests plus one read's worth (and each body to `MAX_BODY`)
MAX_QUEUED = 8
#: a request whose bytes stop arriving for this long is refused (408): without it a client
#: that sends headers and stalls holds its connection and buffers for ever
STALLED_REQUEST_S = 60.0
#: how long `Listener.close` lets answers in flight finish before cutting them
CLOSE_GRACE_S = 10.0

_NO_BODY_STATUS = frozenset({204, 304})


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


class Exchange:
    """One request and its answer. The request is read whole (`body`); the answer is
    written through `start`, `write` and `end` (or `respond`), none of which waits."""

    __slots__ = (
        "_bodiless", "_chunked", "_connection", "_pause", "_resume", "body", "ended", "gone",
        "headers", "http_11", "keep_alive", "method", "path", "query", "raw_path", "started",
    )  # fmt: skip

    def __init__(
        self,
        connection: _Connection,
        method: str,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
        http_11: bool,
    ) -> None:
        self._connection = connection
        self.method = method
        #: the request was HTTP/1.1 (else 1.0: no chunked answer)
        self.http_11 = http_11
        parsed = httptools.parse_url(url)
        #: the path as the client wrote it (percent-encoded) and decoded
        self.raw_path: bytes = parsed.path or b"/"
        self.path: str = unquote(self.raw_path.decode("latin-1"))
        self.query: bytes = parsed.query or b""
        #: header names lower-cased, values as sent
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        #: resolved when the client leaves before the answer ended
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.started = False
        self.ended = False
        self._chunked = False
        self._bodiless = False
        self._pause: Callable[[], None] | None = None
        self._resume: Callable[[], None] | None = None

    def on_flow(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        """Call `pause` when the client's socket stops taking the answer, `resume` when it
        takes it again (the relay stops reading the engine meanwhile)."""
        self._pause, self._resume = pause, resume
        if self._connection.write_paused:
            pause()

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Write the answer's head: `headers` as given (names lower-case), framed by their
        `content-length` when there is one, else chunked."""
        if self.started:
            raise RuntimeError("the answer has started already")
        self.started = True
        connection = self._connection
        if connection.draining:
            self.keep_alive = False
        lines = [_status_line(status)]
        length = False
        for name, value in headers:
            if name == b"content-length":
                length = True
            elif name == b"connection" and b"close" in value.lower():
                self.keep_alive = False
            lines.append(name + b": " + value + b"\r\n")
        bodiless = self.method == "HEAD" or status < 200 or status in _NO_BODY_STATUS
        if not length and not bodiless:
            if self.http_11:
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            else:  # HTTP/1.0 has no chunks: the connection's end delimits the body
                self.keep_alive = False
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        connection.send(b"".join(lines))
        self._bodiless = bodiless

    def write(self, data: bytes) -> None:
        """Pass body bytes to the client as they are (framed as a chunk if chunked)."""
        if data and not self._bodiless:
            if self._chunked:
                self._connection.send(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self._connection.send(data)

    def end(self) -> None:
        """The answer is complete."""
        if self.ended:
            return
        self.ended = True
        if self._chunked:
            self._connection.send(b"0\r\n\r\n")

    def abort(self) -> None:
        """The answer cannot be completed (its source broke off): cut the connection, so
        the client cannot take a truncated body for a whole one."""
        self.ended = True
        self.keep_alive = False
        self._connection.abort()

    def respond(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """A whole answer of the tap's own."""
        self.start(status, [*headers, (b"content-length", b"%d" % len(body))])
        self.write(body)
        self.end()

    # the connection's side -----------------------------------------------------------

    def _client_gone(self) -> None:
        if not self.gone.done():
            self.gone.set_result(None)

    def _paused(self, paused: bool) -> None:
        hook = self._pause if paused else self._resume
        if hook is not None:
            hook()


Handler = Callable[[Exchange], Awaitable[None]]


class _Connection(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order."""

    def __init__(self, handler: Handler, connections: set[_Connection]) -> None:
        self._handler = handler
        self._connections = connections
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()
        self._too_large = False
        self._queue: collections.deque[Exchange] = collections.deque()
        self._runner: asyncio.Task[None] | None = None
        self.current: Exchange | None = None
        self._idle: asyncio.TimerHandle | None = None
        self.closed = False
        self.write_paused = False
        self._http_11 = True
        #: a request's body is arriving (the idle timer must not cut it)
        self._in_message = False
        #: a request's `100 Continue` waits for the answers before it
        self._continue_pending = False
        #: answered once what is queued is: (status, reason), then the connection closes
        self._refusal: tuple[int, bytes] | None = None
        #: the listener is closing: each answer is the connection's last
        self.draining = False
        #: reading is paused until the queue drains (`MAX_QUEUED`), not for good
        self._queue_full = False
        #: reading is stopped for good (a refusal or an upgrade): nothing more is parsed
        self._reading_stopped = False
        #: when the client's last bytes arrived, and the timer watching a request's arrival
        self._last_read = 0.0
        self._stall: asyncio.TimerHandle | None = None

    # asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self._last_read = asyncio.get_running_loop().time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # an upgrade the tap cannot make (h2c, websocket): a request already read is
            # answered as plain HTTP/1.1, as uvicorn did; nothing after it can be read
            if self.busy:
                self._last_after_queue()
            else:
                self._refuse(400, b"connection upgrades are not supported by the tap")
        except httptools.HttpParserError as error:
            self._refuse(400, f"malformed request: {error}".encode("latin-1", "replace"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._stall is not None:
            self._stall.cancel()
        if self.current is not None and not self.current.ended:
            self.current._client_gone()
        for waiting in self._queue:
            waiting._client_gone()
        self._queue.clear()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.current is not None:
            self.current._paused(True)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.current is not None:
            self.current._paused(False)

    # httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._body = bytearray()
        self._too_large = False
        self._in_message = True
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._stall is None:
            loop = asyncio.get_running_loop()
            self._stall = loop.call_later(STALLED_REQUEST_S, self._check_stalled)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._http_11 = self._parser.get_http_version() == "1.1"
        expects = any(k == b"expect" and v.lower() == b"100-continue" for k, v in self._headers)
        if expects and self._http_11:
            if self.busy:  # sent once the answers before it are
                self._continue_pending = True
            else:
                self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if len(self._body) + len(body) > MAX_BODY:
            self._too_large = True
            return
        self._body += body

    def on_message_complete(self) -> None:
        self._in_message = False
        self._continue_pending = False
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._refusal is not None or self.closed:
            return  # parsed from the read that held a refused request: never answered
        if self._too_large:
            self._refuse(413, b"request body over %d bytes" % MAX_BODY)
            return
        exchange = Exchange(
            self, self._parser.get_method().decode("latin-1"), self._url, self._headers,
            bytes(self._body), self._parser.should_keep_alive(), self._http_11,
        )  # fmt: skip
        self._queue.append(exchange)
        if len(self._queue) >= MAX_QUEUED and not self._queue_full:
            self._queue_full = True
            self._pause_reading()
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())

    # answering -----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self._queue and not self.closed:
                exchange = self.current = self._queue.popleft()
                if self._queue_full and len(self._queue) < MAX_QUEUED:
                    self._queue_full = False
                    if not (self._reading_stopped or self.closed or self.draining):
                        self._last_read = asyncio.get_running_loop().time()
                        self.transport.resume_reading()  # type: ignore[union-attr]
                if self.draining:
                    exchange.keep_alive = False
                try:
                    await self._handler(exchange)
                except Exception:
                    log.exception("tap: answering %s %s", exchange.method, exchange.path)
                    if exchange.started:
                        exchange.abort()
                if not exchange.started:  # an error, or a handler that never answered
                    exchange.respond(500, b'{"error": "tap internal error"}',
                                     [(b"content-type", b"application/json")])  # fmt: skip
                if not exchange.ended:
                    exchange.end()
                self.current = None
                if not exchange.keep_alive or self.draining:
                    self.close()
                    return
            if self._refusal is not None:
                self._refuse(*self._refusal)
            elif self._continue_pending and not self.closed:
                self._continue_pending = False
                self._last_read = asyncio.get_running_loop().time()  # its body starts now
                self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        finally:
            self._runner = None
            if not self.closed and not self._queue and not self._in_message:
                self._arm_idle()

    def _refuse(self, status: int, reason: bytes) -> None:
        """A request the tap cannot take: answered after the ones before it, then the
        connection closed, since what follows it cannot be framed."""
        if self.busy:
            if self._refusal is None:  # the first refusal keeps its place in line
                self._refusal = (status, reason)
            self._stop_reading()
            return
        body = b'{"error": "%s"}' % reason.replace(b'"', b"'")
        head = b"content-type: application/json\r\nconnection: close\r\n"
        length = b"content-length: %d\r\n\r\n" % len(body)
        self.send(_status_line(status) + head + length + body)
        self.close()

    def _last_after_queue(self) -> None:
        """Read no more: the answers queued go out, the last saying so, then the
        connection closes."""
        self._stop_reading()
        last = self._queue[-1] if self._queue else self.current
        if last is not None:
            last.keep_alive = False

    def _stop_reading(self) -> None:
        self._reading_stopped = True
        self._pause_reading()

    def _pause_reading(self) -> None:
        if self.transport is not None and not self.closed and self.transport.is_reading():
            self.transport.pause_reading()

    def _check_stalled(self) -> None:
        """A request began and has not ended: refuse it if its bytes stopped arriving for
        `STALLED_REQUEST_S`. Not counted: time with reading paused by the tap, and time a
        client waits for the `100 Continue` the tap holds back behind an answer."""
        self._stall = None
        if not self._in_message or self.closed or self._reading_stopped:
            return
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._last_read
        held = self._queue_full or self._continue_pending
        if held or quiet < STALLED_REQUEST_S:
            wait = STALLED_REQUEST_S if held else STALLED_REQUEST_S - quiet
            self._stall = loop.call_later(max(wait, 0.01), self._check_stalled)
            return
        self._in_message = False
        self._refuse(408, b"request not received whole: no bytes for %d s" % STALLED_REQUEST_S)

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S, self.close)

    def send(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.closed = True
            self.transport.abort()

    @property
    def runner(self) -> asyncio.Task[None] | None:
        return self._runner

    @property
    def busy(self) -> bool:
        return self.current is not None or bool(self._queue)


class Listener:
    """A listening socket and its connections."""

    def __init__(self, server: asyncio.Server, connections: set[_Connection]) -> None:
        self._server = server
        self._connections = connections

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop accepting; close idle connections at once and the others when their
        answer ends, cutting what is still in flight after `grace_s`."""
        self._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        for connection in self._connections:
            connection.draining = True
        while True:
            for connection in list(self._connections):
                if not connection.busy:
                    connection.close()
            if not self._connections or loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        runners = [c.runner for c in self._connections if c.runner is not None]
        for connection in list(self._connections):
            connection.abort()
        # the answers cut end (their relays see the client gone); one still waiting for
        # its engine's head is cancelled, so nothing of it runs after the close
        if runners:
            await asyncio.wait(runners, timeout=1.0)
            for runner in runners:
                runner.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)


async def listen(handler: Handler, host: str, port: int) -> Listener:
    """Serve `handler` on `host:port` (0: any free port) in the running loop."""
    connections: set[_Connection] = set()
    server = await asyncio.get_running_loop().create_server(
        lambda: _Connection(handler, connections), host, port
    )
    return Listener(server, connections)
