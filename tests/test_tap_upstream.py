"""The tap's upstream HTTP/1.1 client against a scripted engine on loopback: a raw asyncio
server that writes exactly the bytes each test names (framing, early closes, idle
closes), so every way an answer can arrive or break off is exercised for real."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from shadow.connectors.tap import upstream as upstream_module
from shadow.connectors.tap.upstream import UpstreamClient, UpstreamError

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


class Engine:
    """Serves `script` per request; counts connections and keeps each request's bytes."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> Engine:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                while True:
                    try:
                        request = await _read_request(reader)
                    except (asyncio.IncompleteReadError, ConnectionError):
                        return
                    self.requests.append(request)
                    await self.script(reader, writer, len(self.requests))
                    if writer.is_closing():
                        return
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def _answer(client: UpstreamClient, method: str, url: str) -> tuple[int, bytes]:
    """One exchange read whole: its status and body."""
    response = await client.send(method, url, [])
    try:
        return response.status_code, await response.aread()
    finally:
        await response.aclose()


def test_a_chunked_stream_arrives_piece_by_piece_and_the_connection_is_reused():
    async def script(reader, writer, n):
        writer.write(HEAD + b"x-engine: e\r\n\r\n")
        for part in (b"data: one\n\n", b"data: two\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            for _ in range(2):
                response = await client.send(
                    "POST", engine.url + "/v1/completions?x=1", [(b"x-a", b"1")], b"{}"
                )
                assert response.status_code == 200
                assert (b"x-engine", b"e") in response.raw_headers
                pieces = []
                while data := await response.read():
                    pieces.append(data)
                await response.aclose()
                assert pieces == [b"data: one\n\n", b"data: two\n\n"]
            assert engine.connections == 1, "a finished answer gives its connection back"
            first = engine.requests[0]
            assert first.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n")
            assert b"\r\nx-a: 1\r\n" in first and b"\r\ncontent-length: 2\r\n" in first
            await client.aclose()

    run(main())


def test_bodies_by_length_and_by_the_connections_end():
    async def script(reader, writer, n):
        if n == 1:
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\n\r\nnope!")
        else:  # no length, no chunking: the body is what comes before the close
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
            await writer.drain()
            writer.close()

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            assert await _answer(client, "GET", engine.url + "/v1/models") == (404, b"nope!")
            assert await _answer(client, "GET", engine.url + "/health") == (200, b"all of it")
            await client.aclose()

    run(main())


def test_an_answer_that_breaks_off_is_an_upstream_error():
    async def script(reader, writer, n):
        writer.write(HEAD + b"\r\n" + b"b\r\ndata: one\n\n\r\n")
        await writer.drain()
        writer.transport.abort()

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")
            assert await response.read() == b"data: one\n\n"
            with pytest.raises(UpstreamError, match="mid-response"):
                await response.read()
            await response.aclose()
            await client.aclose()

    run(main())


def test_a_closed_port_and_a_malformed_answer_are_upstream_errors():
    async def script(reader, writer, n):
        writer.write(b"SPDY/9 what\r\n\r\n")

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            with pytest.raises(UpstreamError, match="malformed"):
                await client.send("GET", engine.url + "/", [])
            url = engine.url
        with pytest.raises(UpstreamError, match="cannot connect"):
            await client.send("GET", url + "/", [])
        with pytest.raises(UpstreamError, match="plain http"):
            await client.send("GET", "https://127.0.0.1:1/", [])
        await client.aclose()

    run(main())


def test_an_idle_connection_the_engine_closed_is_replaced_not_failed():
    """The engine closes an idle keep-alive connection as the next request goes out: it
    never read that request, so the client sends it again on a new connection."""

    async def script(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        if n == 1:
            await asyncio.sleep(0.05)
            writer.transport.abort()  # closed while idle, as an engine's keep-alive expires

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient(keepalive_expiry_s=60)
            response = await client.send("GET", engine.url + "/a", [])
            assert await response.aread() == b"ok"
            await response.aclose()
            await asyncio.sleep(0.2)
            response = await client.send("GET", engine.url + "/b", [])
            assert await response.aread() == b"ok"
            await response.aclose()
            assert engine.connections == 2
            await client.aclose()

    run(main())


def test_a_slow_reader_stops_the_socket_being_read(monkeypatch):
    """Bounded buffering: past HIGH_WATER bytes waiting, reading pauses (what waits is
    at most HIGH_WATER and one read, 256 KiB), reading the answer resumes it, and every
    byte arrives."""
    monkeypatch.setattr(upstream_module, "HIGH_WATER", 4096)
    monkeypatch.setattr(upstream_module, "LOW_WATER", 1024)
    part = b"x" * 1000

    async def script(reader, writer, n):
        writer.write(HEAD + b"\r\n" + _chunked(*[part] * 4000)[: -len(b"0\r\n\r\n")])
        await writer.drain()
        writer.write(b"0\r\n\r\n")

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")
            await asyncio.sleep(0.3)  # the engine writes everything it can meanwhile
            connection = response._connection
            assert not connection._reading
            assert response._buffered <= 4096 + 256 * 1024 < len(part) * 4000
            body = await response.aread()
            assert body == part * 4000
            await response.aclose()
            await client.aclose()

    run(main())


def test_stream_to_hands_over_every_byte_and_keeps_a_consumers_pause(monkeypatch):
    """The relay's way of reading: what was buffered before and what arrives after goes
    to the receiver in order; a pause the consumer asked for (its client is slow) holds
    even across `stream_to`, which would otherwise read again, until it resumes."""
    monkeypatch.setattr(upstream_module, "HIGH_WATER", 4096)
    monkeypatch.setattr(upstream_module, "LOW_WATER", 1024)
    part = b"y" * 1000

    async def script(reader, writer, n):
        writer.write(HEAD + b"\r\n" + _chunked(*[part] * 400))

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")
            await asyncio.sleep(0.3)  # past HIGH_WATER: the socket is no longer read
            connection = response._connection
            assert not connection._reading and response._buffered > 0
            received: list[bytes] = []
            response.pause()  # the consumer's client is slow
            body = response.stream_to(received.append)
            assert not connection._reading, "stream_to read again under the consumer's pause"
            await asyncio.sleep(0.1)
            assert not body.done()
            response.resume()
            await asyncio.wait_for(body, 5)
            assert b"".join(received) == part * 400
            await response.aclose()
            await client.aclose()

    run(main())


def test_chunks_that_arrive_together_are_handed_over_together():
    """Three chunks in one write reach `stream_to`'s receiver as one piece (one write to
    the client, one accounting pass), whether they were buffered before it or arrive
    after; the next write's come as another."""
    gates = [asyncio.Event(), asyncio.Event()]

    def three(tag: bytes) -> bytes:
        return b"".join(b"3\r\n%s%d%d\r\n" % (tag, i, i) for i in range(3))

    async def script(reader, writer, n):
        writer.write(HEAD + b"\r\n" + three(b"a"))  # with the head: buffered
        await writer.drain()
        await gates[0].wait()
        writer.write(three(b"b"))  # while streaming: one read, three chunks
        await writer.drain()
        await gates[1].wait()
        writer.write(b"3\r\nend\r\n0\r\n\r\n")

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")
            await asyncio.sleep(0.1)
            received: list[bytes] = []
            body = response.stream_to(received.append)
            gates[0].set()
            for _ in range(100):  # until the second write's read is handed over
                if len(received) == 2:
                    break
                await asyncio.sleep(0.01)
            gates[1].set()
            await asyncio.wait_for(body, 5)
            assert received == [b"a00a11a22", b"b00b11b22", b"end"]
            await response.aclose()
            await client.aclose()

    run(main())


def test_a_receiver_failing_on_the_last_read_fails_the_body():
    """The read that ends the body (vLLM's usage chunk, [DONE] and the terminator come
    together) is handed over before the end is signalled: a receiver that fails on it
    fails the body instead of the failure vanishing behind a whole answer."""

    async def script(reader, writer, n):
        writer.write(HEAD + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"4\r\nlast\r\n0\r\n\r\n")

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")

            def receiver(data: bytes) -> None:
                raise ValueError(f"cannot account for {data!r}")

            body = response.stream_to(receiver)
            with pytest.raises(UpstreamError, match="cannot account"):
                await asyncio.wait_for(body, 5)
            await response.aclose()
            await client.aclose()

    run(main())


def test_a_response_left_unread_closes_its_connection():
    async def script(reader, writer, n):
        writer.write(HEAD + b"\r\n" + b"b\r\ndata: one\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")
            assert await response.read() == b"data: one\n\n"
            await response.aclose()  # the client left: the rest must not reuse this socket
            assert response._connection.closed
            await client.aclose()

    run(main())


def test_an_interim_100_continue_is_skipped_and_the_next_request_gets_its_own_answer():
    """An engine that answers `100 Continue` first (uvicorn does, to an `Expect` header):
    the answer is the 200 after it, and the connection stays in step."""

    async def script(reader, writer, n):
        body = b"resp-%d" % n
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the interim answer arrives on its own, as over a network
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            for n in (1, 2):
                response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")
                assert (response.status_code, await response.aread()) == (200, b"resp-%d" % n)
                await response.aclose()
            assert engine.connections == 1
            await client.aclose()

    run(main())


def test_a_head_answer_with_a_length_does_not_shift_the_next_answer():
    """vLLM answers `HEAD /health` with 405 and `content-length: 31` but no body: the
    next request must not read its answer through that length."""

    async def script(reader, writer, n):
        if n == 1:
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 31\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient()
            assert await _answer(client, "HEAD", engine.url + "/health") == (405, b"")
            assert await _answer(client, "GET", engine.url + "/v1/models") == (200, b"ok")
            await client.aclose()

    run(main())


def test_a_post_whose_reused_connection_dies_unanswered_is_not_sent_again():
    """The engine read the request and died before answering (a non-streaming answer
    sends nothing until it is done): a generation must not run twice."""

    async def script(reader, writer, n):
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        else:
            await asyncio.sleep(0.2)
            writer.transport.abort()

    async def main():
        async with Engine(script) as engine:
            client = UpstreamClient(keepalive_expiry_s=60)
            response = await client.send("POST", engine.url + "/v1/completions", [], b"{}")
            assert await response.aread() == b"ok"
            await response.aclose()
            with pytest.raises(UpstreamError, match="before the response"):
                await client.send("POST", engine.url + "/v1/completions", [], b"{}")
            assert len(engine.requests) == 2, "sent once each, never again"
            await client.aclose()

    run(main())
