"""The tap's HTTP/1.1 client to the engines: an asyncio protocol and httptools' C parser.

Why not httpx: the tap's cost is per chunk, and httpx reads a body chunk through httpcore,
anyio, h11 and sniffio, about two thirds of the tap's CPU per chunk (a profile of `shadow
tap` relaying 12,000 vLLM-shaped chunks). Here a chunk is one `data_received`, one
`feed_data` in C and one wake-up of the relaying task.

What it does and no more: one request per connection at a time, keep-alive with a pool
per host (idle connections expire after `keepalive_expiry_s`, below the engines' own 5 s;
a GET, HEAD or OPTIONS that finds its reused connection closed goes again on a new one),
interim 1xx answers skipped, the body as the engine framed it, de-chunked (`read`,
several pieces that arrived together joined into one), bounded buffering (the socket
stops being read past `HIGH_WATER` bytes waiting for a slow client), a connect timeout
and no read timeout. Nothing is added to the request but `Host` and `Content-Length`;
nothing is decoded. Failures raise `UpstreamError`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

log = logging.getLogger(__name__)

#: the socket stops being read while this many bytes wait for the client, and is read
#: again below LOW_WATER
HIGH_WATER = 1 << 20
LOW_WATER = 1 << 18


#: requests sent again on a new connection when a reused one is lost before any answer
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})


class UpstreamError(Exception):
    """The engine could not be reached, or its answer broke off or was not HTTP."""


class UpstreamResponse:
    """A response whose head has arrived; the body follows through `read`."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status_code = 0
        #: the head's headers as sent (names as the engine wrote them)
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._complete = False
        self._error: str | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        #: `stream_to`'s receiver and its end, and what arrived for it in the current read
        self._receiver: Callable[[bytes], None] | None = None
        self._arrived: list[bytes] = []
        self._streamed: asyncio.Future[None] | None = None
        #: `pause`d by the consumer (its client reads slower): only `resume` reads again
        self._held = False

    # the connection's side ----------------------------------------------------------

    def _body(self, data: bytes) -> None:
        if self._receiver is not None:
            self._arrived.append(data)  # handed over once the read is parsed (`_deliver`)
            return
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._connection.pause_reading()
        self._wake()

    def _end(self, error: str | None = None) -> None:
        if self._complete or self._error is not None:
            return
        # what the read that ends the body brought goes first (the end is parsed before
        # `_deliver` runs): a receiver failing on it fails the body, it does not vanish
        self._deliver()
        if self._complete or self._error is not None:
            return
        if error is None:
            self._complete = True
        else:
            self._error = error
        self._receiver = None  # nothing after the end (or of a failed body) is relayed
        self._wake()
        streamed = self._streamed
        if streamed is not None and not streamed.done():
            if error is None:
                streamed.set_result(None)
            else:
                streamed.set_exception(UpstreamError(error))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # the reader's side --------------------------------------------------------------

    async def read(self) -> bytes:
        """The next body bytes as they arrive (de-chunked, not decoded; what arrived
        together comes as one piece), b"" at the end. Raises `UpstreamError` if the
        answer broke off. (A coroutine, not an async generator: one frame less per
        chunk on the tap's hot path.)"""
        pieces = self._pieces
        while not pieces:
            if self._complete:
                return b""
            if self._error is not None:
                raise UpstreamError(self._error)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = pieces.popleft() if len(pieces) == 1 else _drain(pieces)
        self._buffered -= len(data)
        if self._buffered < LOW_WATER and not self._held:
            self._connection.resume_reading()
        return data

    def stream_to(self, receiver: Callable[[bytes], None]) -> asyncio.Future[None]:
        """Hand the body to `receiver` as it arrives, from the connection's callback (no
        task wakes per chunk: the tap's relay); the future ends with the body, or with
        `UpstreamError` if it broke off (or `receiver` raised). `pause` and `resume`
        stop and restart reading the socket meanwhile. Instead of `read`, not with it."""
        self._streamed = streamed = asyncio.get_running_loop().create_future()
        pieces = self._pieces
        if pieces and self._error is None:
            data = _drain(pieces)
            self._buffered -= len(data)
            self._body_to(receiver, data)
        if not self._held:
            self._connection.resume_reading()
        if streamed.done():
            return streamed
        if self._error is not None:
            streamed.set_exception(UpstreamError(self._error))
        elif self._complete:
            streamed.set_result(None)
        else:
            self._receiver = receiver
        return streamed

    def _deliver(self) -> None:
        """What one read brought, to the receiver as one piece: what arrives together
        goes out together (vLLM's bursts put several chunks in one read), one write and
        one accounting pass instead of one per chunk."""
        arrived = self._arrived
        receiver = self._receiver
        if arrived and receiver is not None:
            data = arrived[0] if len(arrived) == 1 else b"".join(arrived)
            arrived.clear()
            self._body_to(receiver, data)

    def _body_to(self, receiver: Callable[[bytes], None], data: bytes) -> None:
        try:
            receiver(data)
        except Exception as error:  # the receiver's failure ends the stream, not the loop
            log.exception("tap: relaying a piece of the engine's answer")
            self._end(f"the tap failed on a chunk: {error!r}")
            self._connection.close()

    def pause(self) -> None:
        self._held = True
        self._connection.pause_reading()

    def resume(self) -> None:
        self._held = False
        self._connection.resume_reading()

    async def aread(self) -> bytes:
        parts = []
        while data := await self.read():
            parts.append(data)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Done with the response: a fully read one gives its connection back to the pool,
        any other closes it (the rest of its body would still arrive on it)."""
        if self._closed:
            return
        self._closed = True
        self._connection.release(reusable=self._complete and not self._pieces)


def _drain(pieces: collections.deque[bytes]) -> bytes:
    data = b"".join(pieces)
    pieces.clear()
    return data


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine: parses what arrives into the current
    response."""

    def __init__(self, pool: UpstreamClient, key: tuple[str, int]) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        #: made per exchange (`start`)
        self._parser: httptools.HttpResponseParser | None = None
        #: an interim 1xx answer (100 Continue) is being read: the real one follows
        self._interim = False
        self._response: UpstreamResponse | None = None
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._head_only = False
        self._framed = False
        self._keep_alive = True
        self._reading = True
        self.closed = False
        self.idle_since = 0.0
        #: a byte of the current exchange's answer has arrived
        self.answered = False

    # asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.answered = True
        if self._response is None:
            self._fail("the engine sent bytes without a request")
            return
        assert self._parser is not None  # a response is under way, so is its parser
        response = self._response
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the engine upgraded the connection")
        except httptools.HttpParserError as error:
            self._fail(f"malformed response: {error}")
        else:
            response._deliver()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        response = self._response
        if response is None:
            return
        if self._head is not None and not self._head.done():
            reason = f"connection closed before the response: {exc or 'EOF'}"
            self._head.set_exception(UpstreamError(reason))
        elif not self._framed and exc is None:
            response._end()  # a body delimited by the connection's end: this is it
        else:
            response._end(f"connection closed mid-response: {exc or 'EOF'}")

    # httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._response is not None
        self._response.raw_headers.append((name, value))
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        response, parser = self._response, self._parser
        assert response is not None and self._head is not None and parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200:  # 101 is an upgrade: httptools raises it as one
            self._interim = True  # not the answer: its head is dropped, the answer follows
            response.raw_headers.clear()
            self._framed = False
            return
        response.status_code = status
        self._keep_alive = parser.should_keep_alive() and not self._head_only
        if self._head_only or status in (204, 304):
            self._framed = True
        if not self._head.done():
            self._head.set_result(response)
        if self._head_only:
            self._message_complete()

    def on_body(self, body: bytes) -> None:
        assert self._response is not None
        self._response._body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
        elif not self._head_only:
            self._message_complete()

    def _message_complete(self) -> None:
        response = self._response
        if response is not None:
            response._end()

    # the pool's side -----------------------------------------------------------------

    def start(self, request: bytes, head_only: bool) -> asyncio.Future[UpstreamResponse]:
        assert self.transport is not None
        # a parser per exchange: an answer it could not delimit (a HEAD's, whose length
        # describes a body that never comes) cannot shift the next one; after a HEAD the
        # connection is not reused at all (`_keep_alive`)
        self._parser = httptools.HttpResponseParser(self)
        self._interim = False
        self._response = UpstreamResponse(self)
        self._head = asyncio.get_running_loop().create_future()
        self._head_only = head_only
        self._framed = False
        self._keep_alive = True
        self.answered = False
        self.transport.write(request)
        return self._head

    def pause_reading(self) -> None:
        if self._reading and self.transport is not None and not self.closed:
            self._reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self._reading and self.transport is not None and not self.closed:
            self._reading = True
            self.transport.resume_reading()

    def release(self, reusable: bool) -> None:
        self._response = None
        self._head = None
        self.resume_reading()
        if reusable and self._keep_alive and not self.closed:
            self.idle_since = time.monotonic()
            self._pool.give_back(self)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def _fail(self, reason: str) -> None:
        response = self._response
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamError(reason))
        elif response is not None:
            response._end(reason)
        self.close()


class UpstreamClient:
    """Keep-alive HTTP/1.1 connections to the engines, pooled per host and port."""

    def __init__(self, *, connect_timeout_s: float = 5.0, keepalive_expiry_s: float = 2.0):
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._closed = False

    async def send(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
    ) -> UpstreamResponse:
        """Send the request; return once the response's head has arrived."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise UpstreamError(f"unsupported upstream URL {url!r}: plain http://host:port only")
        key = (parts.hostname, parts.port or 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        request = _request_bytes(method, target, parts.netloc, headers, body)
        connection = self._reuse(key)
        if connection is not None:
            try:
                return await self._exchange(connection, request, method)
            except UpstreamError:
                # A reused connection lost before any answer: the engine most likely
                # closed it idle as the request went out, but it may also have read the
                # request and died computing it (a non-streaming answer sends nothing
                # until the end). Only a request that may run twice goes again.
                if connection.answered or method not in IDEMPOTENT:
                    raise
        return await self._exchange(await self._connect(key), request, method)

    @staticmethod
    async def _exchange(connection: _Connection, request: bytes, method: str) -> UpstreamResponse:
        head = connection.start(request, head_only=method == "HEAD")
        try:
            return await head
        except BaseException:
            connection.close()
            raise

    def _reuse(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < self.keepalive_expiry_s:
                return connection
            connection.close()
        return None

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self, key), key[0], key[1]),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise UpstreamError(f"connect timeout to {key[0]}:{key[1]}") from None
        except OSError as error:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {error}") from None
        return protocol

    def give_back(self, connection: _Connection) -> None:
        if self._closed:
            connection.close()
            return
        self._idle.setdefault(connection.key, []).append(connection)

    def forget(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


def _request_bytes(
    method: str, target: str, netloc: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {netloc}\r\n".encode("latin-1")]
    for name, value in headers:
        lines.append(name + b": " + value + b"\r\n")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(b"content-length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)
