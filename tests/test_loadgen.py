"""The load generator against a real streaming server on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from shadow.replay.workload import Workload
from shadow.workloads.synthetic import generate
from shadow.world.loadgen import RequestOutcome, request_body, run_load, summarize_load
from tests.service_helpers import ThreadedServer


class StreamServer:
    """An OpenAI-style SSE server: `max_tokens` token chunks, a usage chunk, [DONE].

    It records, per `x-request-id`, the body it received, the bytes it sent, and whether
    the client went away mid-stream.
    """

    def __init__(self, token_delay_s: float = 0.002) -> None:
        self.token_delay_s = token_delay_s
        self.fail: dict[str, int] = {}  # request id -> status to answer with
        self.bodies: dict[str, dict] = {}
        self.sent: dict[str, bytearray] = {}
        self.finished: set[str] = set()
        self.disconnected: set[str] = set()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.port = 0
        self._http: ThreadedServer | None = None

    async def _completions(self, request: Request) -> Response:
        rid = request.headers["x-request-id"]
        body = await request.json()
        self.bodies[rid] = body
        if rid in self.fail:
            return JSONResponse({"error": {"message": "overloaded"}}, self.fail[rid])
        chat = request.url.path.endswith("/chat/completions")
        return StreamingResponse(self._stream(rid, body, chat), media_type="text/event-stream")

    def _chunk(self, rid: str, chat: bool, j: int, n: int) -> bytes:
        finish = "length" if j == n - 1 else None
        if chat:
            choice = {"index": 0, "delta": {"content": f"w{j} "}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": f"w{j} ", "finish_reason": finish}
        return b"data: " + json.dumps({"id": rid, "choices": [choice]}).encode() + b"\n\n"

    async def _stream(self, rid: str, body: dict, chat: bool) -> AsyncIterator[bytes]:
        n = int(body["max_tokens"])
        sent = self.sent.setdefault(rid, bytearray())
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            chunks: list[bytes] = []
            if chat:  # vLLM's first chat chunk carries the role and no text
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                chunks.append(b"data: " + json.dumps({"choices": [role]}).encode() + b"\n\n")
            for j in range(n):
                chunks.append(self._chunk(rid, chat, j, n))
            usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
            chunks.append(b"data: " + json.dumps({"choices": [], "usage": usage}).encode())
            chunks.append(b"\n\n")  # split an event across writes, as proxies do
            chunks.append(b"data: [DONE]\n\n")
            for chunk in chunks:
                await asyncio.sleep(self.token_delay_s)
                sent.extend(chunk)
                yield chunk
            self.finished.add(rid)
        except (asyncio.CancelledError, GeneratorExit):
            self.disconnected.add(rid)
            raise
        finally:
            self.in_flight -= 1

    def start(self) -> StreamServer:
        app = Starlette(
            routes=[
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/chat/completions", self._completions, methods=["POST"]),
            ]
        )
        self._http = ThreadedServer(app, timeout_graceful_shutdown=2, backlog=2048).start()
        self.port = self._http.port
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def server():
    srv = StreamServer().start()
    yield srv
    srv.stop()


def workload(ready: list[float], outputs: list[int], prompts: list[int] | None = None) -> Workload:
    prompts = prompts if prompts is not None else [5] * len(ready)
    return Workload.from_arrays("test", ready, prompts, outputs)


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_all_complete_with_token_counts_digests_and_bodies(server: StreamServer) -> None:
    wl = workload([0.0, 0.0, 0.01, 0.02, 0.02], [1, 7, 3, 20, 2], prompts=[0, 3, 10, 1, 4])
    progress: list[tuple[int, int]] = []
    outcomes = asyncio.run(
        run_load(server.url, wl, progress=lambda done, total: progress.append((done, total)))
    )
    assert [o.index for o in outcomes] == list(range(5))
    assert progress[-1] == (5, 5) and len(progress) == 5
    for i, outcome in enumerate(outcomes):
        rid = f"lg-{i}"
        assert outcome.request_id == rid
        assert outcome.status == 200 and outcome.error is None
        assert outcome.complete and not outcome.cancelled
        assert outcome.tokens == wl.output_tokens[i]
        assert outcome.usage_completion_tokens == wl.output_tokens[i]
        assert outcome.digest == hashlib.sha256(bytes(server.sent[rid])).hexdigest()
        assert outcome.sent_at <= outcome.first_byte_at <= outcome.done_at
        body = server.bodies[rid]
        assert body["model"] == "emulated-model"
        assert body["prompt"] == [1] * max(1, int(wl.prompt_tokens[i]))
        assert body["max_tokens"] == wl.output_tokens[i]
        assert body["ignore_eos"] is True and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
    summary = summarize_load(outcomes)
    assert summary["sent"] == 5 and summary["complete"] == 5
    assert summary["cancelled"] == 0 and summary["errors"] == 0
    assert summary["tokens"] == 33 and summary["tokens_per_s"] > 0
    assert 0 < summary["first_byte_p50_s"] <= summary["first_byte_p95_s"]
    assert summary["statuses"] == {"200": 5}


def test_chat_mode_counts_delta_content_only(server: StreamServer) -> None:
    wl = workload([0.0, 0.0], [4, 1], prompts=[3, 2])

    async def with_own_client() -> list[RequestOutcome]:
        async with httpx.AsyncClient() as client:
            outcomes = await run_load(
                server.url + "/", wl, chat=True, model="m", request_id_prefix="chat", client=client
            )
            assert not client.is_closed  # the caller's client stays the caller's
            return outcomes

    outcomes = asyncio.run(with_own_client())
    assert [o.tokens for o in outcomes] == [4, 1]  # the role-only first chunk is not a token
    assert all(o.complete and o.error is None for o in outcomes)
    body = server.bodies["chat-0"]
    assert body["messages"] == [{"role": "user", "content": "hello hello hello"}]
    assert body["model"] == "m" and "prompt" not in body


def test_send_times_follow_ready_over_time_scale(server: StreamServer) -> None:
    ready = [0.0, 0.5, 0.6, 1.5, 2.0, 3.0]
    wl = workload(ready, [2] * len(ready))
    outcomes = asyncio.run(run_load(server.url, wl, time_scale=4.0))
    sent = np.array([o.sent_at for o in outcomes])
    expected = np.array(ready) / 4.0
    assert np.all(np.abs((sent - sent[0]) - expected) < 0.05), sent - sent[0]
    assert all(o.complete for o in outcomes)


def test_cancel_after_disconnects_mid_stream(server: StreamServer) -> None:
    wl = workload([0.0, 0.0, 0.0, 0.0], [50, 50, 5, 50])
    server.token_delay_s = 0.005
    outcomes = asyncio.run(run_load(server.url, wl, cancel_after={0: 3, 1: 0, 2: 99}))
    first, at_start, beyond, normal = outcomes
    assert first.cancelled and not first.complete and first.tokens == 3
    assert first.error is None and first.done_at is not None
    assert at_start.cancelled and at_start.tokens == 0
    assert not beyond.cancelled and beyond.complete and beyond.tokens == 5
    assert normal.complete and normal.tokens == 50
    wait_for(lambda: {"lg-0", "lg-1"} <= server.disconnected)
    assert "lg-0" not in server.finished and "lg-3" in server.finished
    # The client's digest covers a prefix of what the server sent before it noticed.
    assert len(server.sent["lg-0"]) < len(server.sent["lg-3"])
    assert summarize_load(outcomes)["cancelled"] == 2


def test_error_status_and_dead_server_are_recorded_not_raised(server: StreamServer) -> None:
    server.fail["lg-1"] = 503
    outcomes = asyncio.run(run_load(server.url, workload([0.0, 0.0, 0.0], [3, 3, 3])))
    assert outcomes[1].status == 503 and not outcomes[1].complete
    assert outcomes[1].error is not None and "HTTP 503" in outcomes[1].error
    assert "overloaded" in outcomes[1].error
    assert outcomes[0].complete and outcomes[2].complete
    summary = summarize_load(outcomes)
    assert summary["errors"] == 1 and summary["statuses"] == {"200": 2, "503": 1}

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    failed = asyncio.run(run_load(dead, workload([0.0, 0.01], [3, 3])))
    assert all(o.status is None and o.error and "Connect" in o.error for o in failed)
    assert summarize_load(failed)["errors"] == 2


def test_many_in_flight_and_max_in_flight(server: StreamServer) -> None:
    wl = generate("small", seed=1, n=200)
    wl = Workload(
        wl.name,
        np.zeros(len(wl)),
        wl.prompt_tokens,
        np.minimum(wl.output_tokens, 10),
        wl.prompt_keys,
    )
    outcomes = asyncio.run(run_load(server.url, wl))
    assert all(o.complete and o.tokens == wl.output_tokens[o.index] for o in outcomes)
    assert server.peak_in_flight > 50  # really concurrent

    server.peak_in_flight = 0
    limited = asyncio.run(
        run_load(server.url, wl.head(30), max_in_flight=4, request_id_prefix="cap")
    )
    assert all(o.complete for o in limited)
    assert server.peak_in_flight <= 4


def test_bad_arguments_and_empty_workload(server: StreamServer) -> None:
    with pytest.raises(ValueError, match="time_scale"):
        asyncio.run(run_load(server.url, workload([0.0], [1]), time_scale=0))
    assert asyncio.run(run_load(server.url, workload([], []))) == []
    empty = summarize_load([])
    assert empty["sent"] == 0 and empty["first_byte_p50_s"] is None
    assert request_body(0, 3, model="m", chat=False)["prompt"] == [1]


def test_outcome_is_plain_data() -> None:
    outcome = RequestOutcome(0, "lg-0", None, 0, "", False, False, "x", 1.0, None, None)
    assert outcome.usage_completion_tokens is None
