"""The tap's HTTP/1.1 listener (`connectors/tap/listener.py`), over real loopback sockets:
keep-alive and pipelining, 100-continue, refusals, framing by HTTP version and method, a
client that leaves, and a client too slow for the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from shadow.connectors.tap import listener as listener_module
from shadow.connectors.tap.listener import Exchange, Listener, listen


def _run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 20))


async def _echo(exchange: Exchange) -> None:
    """Answers with the method, path, query and body, streamed in two pieces."""
    exchange.start(200, [(b"content-type", b"text/plain")])
    exchange.write(f"{exchange.method} {exchange.path} ".encode())
    exchange.write(exchange.query + b" " + exchange.body)
    exchange.end()


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One chunked (or length-framed) answer: its head and its de-chunked body."""
    head = await reader.readuntil(b"\r\n\r\n")
    if b"content-length:" in head.lower():
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return head, await reader.readexactly(length)
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return head, body
        body += data[:-2]


def _post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n%s\r\n%s"
            % (path, len(body), extra, body))  # fmt: skip


async def _first_in_flight(
    release: asyncio.Event,
) -> tuple[Listener, asyncio.StreamReader, asyncio.StreamWriter]:
    """A listener echoing requests, and a connection whose `/first` request is being
    answered until `release` is set."""

    async def first_waits(exchange: Exchange) -> None:
        if exchange.path == "/first":
            await release.wait()
        await _echo(exchange)

    served = await listen(first_waits, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(_post(b"/first", b"1"))
    await asyncio.sleep(0.05)
    return served, reader, writer


def test_keep_alive_and_pipelined_requests_are_answered_in_order():
    async def main() -> None:
        served = await listen(_echo, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(_post(b"/a%20b?x=1", b"one"))
        head, body = await _read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
        assert body == b"POST /a b x=1 one"
        writer.write(_post(b"/2", b"two") + _post(b"/3", b"three"))  # pipelined
        assert (await _read_answer(reader))[1] == b"POST /2  two"
        assert (await _read_answer(reader))[1] == b"POST /3  three"
        writer.close()
        await served.close()

    _run(main)


def test_expect_100_continue_is_answered_before_the_answer():
    async def main() -> None:
        served = await listen(_echo, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n"
                     b"expect: 100-continue\r\n\r\n")  # fmt: skip
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"ok")
        assert (await _read_answer(reader))[1] == b"POST /e  ok"
        writer.close()
        await served.close()

    _run(main)


def test_a_malformed_request_is_a_400_and_a_too_large_body_a_413(monkeypatch):
    monkeypatch.setattr(listener_module, "MAX_BODY", 10)

    async def main() -> None:
        served = await listen(_echo, "127.0.0.1", 0)
        for request, status in ((b"NOT HTTP AT ALL\r\n\r\n", b"400"),
                                (_post(b"/big", b"x" * 11), b"413")):  # fmt: skip
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(request)
            answer = await reader.read()  # the tap closes the connection after it
            assert answer.startswith(b"HTTP/1.1 " + status), answer
            assert b"connection: close" in answer and b'"error"' in answer
            writer.close()
        await served.close()

    _run(main)


def test_http_1_0_gets_a_body_ended_by_the_close_and_head_gets_no_body():
    async def main() -> None:
        served = await listen(_echo, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST /old HTTP/1.0\r\ncontent-length: 1\r\n\r\nz")
        answer = await reader.read()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"chunked" not in head and b"connection: close" in head
        assert body == b"POST /old  z"
        writer.close()

        async def head_only(exchange: Exchange) -> None:
            exchange.start(200, [(b"content-length", b"5")])
            exchange.write(b"hello")  # not sent: a HEAD answer has no body
            exchange.end()

        other = await listen(head_only, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", other.port)
        writer.write(b"HEAD /h HTTP/1.1\r\nhost: t\r\n\r\n" + _post(b"/next", b""))
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        second = await reader.readuntil(b"\r\n\r\n")  # the next answer, not a body
        assert second.startswith(b"HTTP/1.1 200") and await reader.readexactly(5) == b"hello"
        writer.close()
        await served.close()
        await other.close()

    _run(main)


def test_a_client_that_leaves_resolves_gone_and_a_slow_one_pauses_the_source():
    async def main() -> None:
        seen: dict[str, object] = {}
        left = asyncio.Event()

        async def endless(exchange: Exchange) -> None:
            flow: list[bool] = []
            exchange.on_flow(lambda: flow.append(True), lambda: flow.append(False))
            exchange.start(200, [])
            while not exchange.gone.done() and not flow:
                exchange.write(b"x" * 65536)  # the client reads nothing
                await asyncio.sleep(0)
            seen["paused"] = list(flow)
            await exchange.gone
            seen["gone"] = True
            left.set()

        served = await listen(endless, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port, limit=1024)
        writer.write(_post(b"/s", b""))
        await reader.readuntil(b"\r\n\r\n")
        for _ in range(200):  # until the tap stops writing: its buffer is over the mark
            if "paused" in seen:
                break
            await asyncio.sleep(0.01)
        writer.transport.abort()
        await asyncio.wait_for(left.wait(), 5)
        assert seen == {"paused": [True], "gone": True}
        await served.close()

    _run(main)


def test_an_error_in_the_handler_is_a_500_before_the_answer_and_a_cut_after(caplog):
    async def main() -> None:
        async def broken(exchange: Exchange) -> None:
            if exchange.path == "/late":
                exchange.start(200, [])
                exchange.write(b"partial")
            raise RuntimeError("boom")

        served = await listen(broken, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(_post(b"/early", b""))
        head, body = await _read_answer(reader)
        assert head.startswith(b"HTTP/1.1 500") and b"tap internal error" in body
        writer.write(_post(b"/late", b""))
        with pytest.raises(asyncio.IncompleteReadError):
            await _read_answer(reader)  # cut: no terminal chunk
        writer.close()
        await served.close()

    _run(main)


def test_an_upgrade_is_served_as_plain_http_and_a_bad_request_after_a_good_one_waits():
    """An h2c upgrade the tap cannot make is answered as HTTP/1.1 (as uvicorn did), then
    the connection closes; a malformed request pipelined behind a good one is refused
    only after the good one's answer."""

    async def main() -> None:
        served = await listen(_echo, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"GET /up HTTP/1.1\r\nhost: t\r\nconnection: Upgrade, HTTP2-Settings\r\n"
                     b"upgrade: h2c\r\nhttp2-settings: AAMAAABk\r\n\r\n")  # fmt: skip
        head, body = await _read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and body == b"GET /up  "
        assert await reader.read() == b""  # closed after it
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(_post(b"/good", b"g") + b"NOT HTTP\r\n\r\n")
        head, body = await _read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and body == b"POST /good  g"
        rest = await reader.read()
        assert rest.startswith(b"HTTP/1.1 400") and b"connection: close" in rest
        writer.close()
        await served.close()

    _run(main)


def test_a_100_continue_behind_an_answer_is_sent_after_it(monkeypatch):
    """Sent once the answer ahead ends; the wait for it, longer than the stall limit
    here, is the tap's doing and never a 408."""
    monkeypatch.setattr(listener_module, "STALLED_REQUEST_S", 0.3)

    async def main() -> None:
        release = asyncio.Event()
        served, reader, writer = await _first_in_flight(release)
        writer.write(b"POST /second HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n"
                     b"expect: 100-continue\r\n\r\n")  # fmt: skip
        await asyncio.sleep(0.7)
        release.set()
        assert (await _read_answer(reader))[1] == b"POST /first  1"
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"2")
        assert (await _read_answer(reader))[1] == b"POST /second  2"
        writer.close()
        await served.close()

    _run(main)


def test_closing_lets_an_answer_in_flight_finish_as_the_last_and_a_silent_handler_is_a_500():
    async def main() -> None:
        release = asyncio.Event()

        async def handler(exchange: Exchange) -> None:
            if exchange.path == "/silent":
                return  # never answers
            exchange.start(200, [])
            exchange.write(b"part one ")
            await release.wait()
            exchange.write(b"part two")
            exchange.end()

        served = await listen(handler, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(_post(b"/silent", b""))
        head, body = await _read_answer(reader)
        assert head.startswith(b"HTTP/1.1 500") and b"tap internal error" in body
        writer.write(_post(b"/stream", b""))
        await reader.readuntil(b"\r\n\r\n")
        closing = asyncio.ensure_future(served.close(grace_s=5))
        await asyncio.sleep(0.1)
        assert not closing.done()  # waits for the answer in flight
        release.set()
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        assert (await reader.readexactly(size + 2))[:-2] == b"part one "
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        assert (await reader.readexactly(size + 2))[:-2] == b"part two"
        assert await reader.readuntil(b"\r\n\r\n") == b"0\r\n\r\n"
        assert await reader.read() == b""  # the connection's last answer
        await asyncio.wait_for(closing, 5)
        writer.close()

    _run(main)


def test_a_refusal_keeps_its_place_and_what_follows_it_in_the_same_read_is_not_answered(
    monkeypatch,
):
    """An oversized request pipelined behind an answer in flight, with another request in
    the same read: the client gets the first answer, then the 413, then the close, never
    an answer it would take for the refused request's."""
    monkeypatch.setattr(listener_module, "MAX_BODY", 10)

    async def main() -> None:
        release = asyncio.Event()
        served, reader, writer = await _first_in_flight(release)
        writer.write(_post(b"/big", b"x" * 11) + _post(b"/after", b"3"))
        await asyncio.sleep(0.05)
        release.set()
        assert (await _read_answer(reader))[1] == b"POST /first  1"
        rest = await reader.read()
        assert rest.startswith(b"HTTP/1.1 413") and b"/after" not in rest
        writer.close()
        await served.close()

    _run(main)


def test_a_pipelining_client_is_read_no_further_than_max_queued_ahead(monkeypatch):
    """Twenty requests pipelined one write at a time behind an answer in flight: the tap
    holds at most `MAX_QUEUED` of them (it stops reading the client) and answers all
    twenty in order once the first ends."""
    monkeypatch.setattr(listener_module, "MAX_QUEUED", 3)

    async def main() -> None:
        release = asyncio.Event()
        served, reader, writer = await _first_in_flight(release)
        (connection,) = served._connections
        deepest = 0
        for index in range(20):
            writer.write(_post(b"/%d" % index, b"x"))
            await asyncio.sleep(0.01)
            deepest = max(deepest, len(connection._queue))
        assert deepest == 3
        release.set()
        assert (await _read_answer(reader))[1] == b"POST /first  1"
        for index in range(20):
            assert (await _read_answer(reader))[1] == b"POST /%d  x" % index
        writer.close()
        await served.close()

    _run(main)


def test_a_request_whose_bytes_stop_arriving_is_a_408_and_a_slow_steady_one_is_not(
    monkeypatch,
):
    monkeypatch.setattr(listener_module, "STALLED_REQUEST_S", 0.5)

    async def main() -> None:
        served = await listen(_echo, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        whole = _post(b"/slow", b"0123456789")
        for start in range(0, len(whole), 8):  # 8 bytes every 0.1 s: slow, never quiet for long
            writer.write(whole[start : start + 8])
            await asyncio.sleep(0.1)
        assert (await _read_answer(reader))[1] == b"POST /slow  0123456789"
        writer.write(whole[:-7])  # the headers and 3 bytes of the body, then nothing
        rest = await asyncio.wait_for(reader.read(), 3)
        assert rest.startswith(b"HTTP/1.1 408") and b"no bytes for" in rest
        writer.close()

        # stalled behind an answer in flight: the 408 comes after that answer
        release = asyncio.Event()
        held, reader, writer = await _first_in_flight(release)
        writer.write(b"POST /stuck HTTP/1.1\r\nhost: t\r\n")
        await asyncio.sleep(1.0)
        release.set()
        assert (await _read_answer(reader))[1] == b"POST /first  1"
        assert (await asyncio.wait_for(reader.read(), 3)).startswith(b"HTTP/1.1 408")
        writer.close()
        await served.close()
        await held.close()

    _run(main)


def test_time_with_reading_paused_by_the_tap_is_no_stall(monkeypatch):
    """A request begun in the read that filled the queue waits, unread, for longer than
    the stall limit while the answer ahead runs: it is answered, not refused 408."""
    monkeypatch.setattr(listener_module, "MAX_QUEUED", 2)
    monkeypatch.setattr(listener_module, "STALLED_REQUEST_S", 0.3)

    async def main() -> None:
        release = asyncio.Event()
        served, reader, writer = await _first_in_flight(release)
        third = _post(b"/4", b"four")
        writer.write(_post(b"/2", b"x") + _post(b"/3", b"x") + third[:20])
        await asyncio.sleep(0.8)
        release.set()
        writer.write(third[20:])
        for path in (b"/first  1", b"/2  x", b"/3  x", b"/4  four"):
            assert (await _read_answer(reader))[1] == b"POST " + path
        writer.close()
        await served.close()

    _run(main)
