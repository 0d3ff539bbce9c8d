"""The tap's HTTP event sink while the service is down: events are kept, and the log
says so once per outage that lasts `OUTAGE_GRACE_S` (then every `OUTAGE_WARN_EVERY_S`),
not once per retry, and not for a moment's refusal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time

import httpx
from fastapi import FastAPI, Request, Response

import shadow.connectors.sink
from shadow.connectors.sink import HttpEventSink
from shadow.world.process import free_port
from tests.service_helpers import ThreadedServer


def test_an_outage_keeps_the_events_and_warns_once_then_periodically(caplog, monkeypatch):
    monkeypatch.setattr(shadow.connectors.sink, "OUTAGE_GRACE_S", 0.0)

    async def scenario() -> list[str]:
        sink = HttpEventSink(f"http://127.0.0.1:{free_port()}", source="tap")  # nobody there
        await sink.start()
        try:
            for i in range(5):
                sink.put({"type": "progress", "ts": float(i), "request_id": "r", "generated": i})
                assert await sink.flush() is False
            quiet = [r.getMessage() for r in caplog.records]
            monkeypatch.setattr(shadow.connectors.sink, "OUTAGE_WARN_EVERY_S", 0.0)
            assert await sink.flush() is False
        finally:
            sink._task.cancel()  # no final flush: the service never came
        assert sink.failures >= 6 and len(sink._buffer) == 5  # every event still kept
        return quiet

    with caplog.at_level(logging.WARNING, logger="shadow.connectors.sink"):
        quiet = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert len(quiet) == 1 and "retrying" in quiet[0] and "tap" in quiet[0]
    assert len(caplog.records) == 2  # the interval passed: one more
    assert "5 events kept" in caplog.records[-1].getMessage()


def _service() -> tuple[ThreadedServer, int, list[bytes]]:
    app = FastAPI()
    received: list[bytes] = []

    @app.post("/v1/events")
    async def events(request: Request) -> dict[str, int]:
        received.append(await request.body())
        return {"accepted": 1}

    port = free_port()
    return ThreadedServer(app, port=port), port, received


def _post_before_and_after_the_service_starts(caplog, events_after: int) -> tuple[int, bytes]:
    """One event posted while nobody listens (kept), then the service starts and
    `events_after` more are put; returns (events the sink sent, the bodies received)."""
    server, port, received = _service()

    async def scenario() -> int:
        sink = HttpEventSink(f"http://127.0.0.1:{port}", source="tap")
        await sink.start()
        try:
            sink.put({"type": "progress", "ts": 1.0, "request_id": "r", "generated": 1})
            assert await sink.flush() is False  # not up yet
            await asyncio.to_thread(server.start)
            for generated in range(2, 2 + events_after):
                sink.put({"type": "progress", "ts": float(generated), "request_id": "r",
                          "generated": generated})  # fmt: skip
            assert await sink.flush() is True
        finally:
            await sink.aclose()
        return sink.sent

    try:
        with caplog.at_level(logging.WARNING, logger="shadow.connectors.sink"):
            sent = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    finally:
        server.stop()
    return sent, b"".join(received)


def test_the_outage_ends_with_the_buffer_sent_and_one_line_saying_so(caplog, monkeypatch):
    monkeypatch.setattr(shadow.connectors.sink, "OUTAGE_GRACE_S", 0.0)
    sent, received = _post_before_and_after_the_service_starts(caplog, events_after=1)
    assert sent == 2
    assert received.count(b'"seq"') == 2  # both events, sent once
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "retrying" in messages[0]
    assert "service reached again after" in messages[1]


def test_an_error_without_a_message_is_named_by_its_type(caplog, monkeypatch):
    """httpx raises some errors (a connection reset mid-request) with an empty message;
    the warning then said "event sink router: ; 3 events kept"."""
    monkeypatch.setattr(shadow.connectors.sink, "OUTAGE_GRACE_S", 0.0)
    sink = HttpEventSink("http://127.0.0.1:9", source="router")
    with caplog.at_level(logging.WARNING, logger="shadow.connectors.sink"):
        sink._warn(httpx.ReadError(""))
    message = caplog.records[-1].getMessage()
    assert message.startswith("event sink router: ReadError; 0 events kept")


def test_a_moment_of_refusal_is_not_logged(caplog):
    """A service starting or stopping refuses connections for a moment (the demo's world
    posts before its service listens); the events are kept and sent, and nothing is said."""
    sent, received = _post_before_and_after_the_service_starts(caplog, events_after=0)
    assert sent == 1
    assert received.count(b'"seq"') == 1
    assert caplog.records == []


def test_closing_right_after_a_wake_stops_the_sender():
    """Python 3.11's `asyncio.wait_for` returns the result, and drops the cancellation,
    when its awaited task finished in the same tick as the cancel. Closed right after a
    full batch woke the sender, the sender then looped on and `aclose` waited forever
    (the tap's and the world's shutdown with it). The wake and the close are arranged in
    exactly that order; the service is down, so the events stay kept."""

    async def scenario() -> HttpEventSink:
        sink = HttpEventSink(
            f"http://127.0.0.1:{free_port()}", source="router", max_batch=1,
            flush_interval_s=60.0,
        )  # fmt: skip
        await sink.start()
        await asyncio.sleep(0)  # the sender is waiting on its wake-up
        sink.put({"type": "ready", "ts": 1.0, "request_id": "r"})  # a full batch wakes it
        await asyncio.sleep(0)  # the awaited wait finished; the sender not yet resumed
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):  # (the old `aclose` ate this cancel too)
            await asyncio.wait_for(sink.aclose(), 5)
        closing_s = time.monotonic() - started
        assert sink._task is not None
        assert sink._task.done(), f"the sender still runs {closing_s:.1f} s after aclose"
        assert closing_s < 5
        return sink

    sink = asyncio.run(scenario())
    assert sink.sent == 0 and len(sink._buffer) == 1


def test_the_taps_own_poster_sends_the_token_and_keeps_what_did_not_land(monkeypatch):
    """The tap posts through its own HTTP client, not httpx: the batch and the bearer token
    arrive as sent; a 5xx answer and a service that accepts but never answers (given up
    after `POST_TIMEOUT_S`) keep the events for the next flush."""
    import shadow.connectors.tap.serve as tap_serve
    from shadow.connectors.tap.upstream import UpstreamClient

    monkeypatch.setattr(tap_serve, "POST_TIMEOUT_S", 0.5)
    app = FastAPI()
    seen: list[tuple[str | None, bytes]] = []
    answer = {"status": 200}

    @app.post("/v1/events")
    async def events(request: Request):
        seen.append((request.headers.get("authorization"), await request.body()))
        if answer["status"] != 200:
            return Response(status_code=answer["status"])
        return {"accepted": 1}

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    server = ThreadedServer(app).start()
    port = server.port

    async def scenario() -> None:
        client = UpstreamClient()
        poster = tap_serve.own_poster(client, "s3cret")
        sink = HttpEventSink(f"http://127.0.0.1:{port}", source="tap", poster=poster)
        try:
            for i in range(3):
                sink.put({"type": "progress", "ts": float(i), "request_id": "r", "generated": i})
            assert await sink.flush() is True and sink.sent == 3
            answer["status"] = 503
            sink.put({"type": "progress", "ts": 3.0, "request_id": "r", "generated": 3})
            assert await sink.flush() is False and len(sink._buffer) == 1
            answer["status"] = 200
            assert await sink.flush() is True and sink.sent == 4
            host, silent_port = silent.getsockname()
            sink.url = f"http://{host}:{silent_port}/v1/events"
            sink.put({"type": "progress", "ts": 4.0, "request_id": "r", "generated": 4})
            started = time.monotonic()
            assert await sink.flush() is False and len(sink._buffer) == 1
            assert 0.4 < time.monotonic() - started < 5.0
        finally:  # the sink was never started: its flushes were called here
            await client.aclose()

    try:
        asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    finally:
        server.stop()
        silent.close()
    assert [token for token, _ in seen] == ["Bearer s3cret"] * 3
    first = [json.loads(line) for line in seen[0][1].splitlines()]
    assert [e["generated"] for e in first] == [0, 1, 2] and first[0]["source"] == "tap"
