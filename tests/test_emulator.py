"""The emulated decode fleet over real loopback HTTP: vLLM's wire format, the replay
engine's step semantics, metrics, disconnects and crashes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shadow.replay.workload import StepModel
from shadow.world.emulator import EmulatedFleet

LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None)


class ListSink:
    """Captures what the fleet `put`s, like `HttpEventSink` would queue it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def put(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def steps(self, worker: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["type"] == "engine_step" and (worker is None or e["worker"] == worker)
        ]


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


async def with_fleet(
    body: Callable[[EmulatedFleet, httpx.AsyncClient], Awaitable[Any]], *args: Any, **kwargs: Any
) -> Any:
    fleet = EmulatedFleet(*args, **kwargs)
    await fleet.start()
    try:
        async with httpx.AsyncClient(limits=LIMITS, timeout=30) as client:
            return await body(fleet, client)
    finally:
        await fleet.stop()


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def sse_payloads(raw: bytes) -> list[str]:
    assert raw.endswith(b"\n\n")
    events = raw.decode().split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


FAST = StepModel(a_ms_per_token=1e-4, b_ms=4.0)


def test_streaming_completion_matches_vllm_and_digest_matches_received_bytes() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        request = {
            "model": "m",
            "prompt": "the quick brown fox",
            "max_tokens": 7,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"x-request-id": "req-1"}
        url = fleet.worker_urls[0] + "/v1/completions"
        async with client.stream("POST", url, json=request, headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
        payloads = sse_payloads(raw)
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        tokens, usage = chunks[:-1], chunks[-1]
        assert len(tokens) == 7
        for i, chunk in enumerate(tokens):
            assert chunk == {
                "id": "cmpl-req-1",
                "object": "text_completion",
                "created": chunk["created"],
                "model": "emulated-model",
                "choices": [
                    {
                        "index": 0,
                        "text": f" tok{i}",
                        "logprobs": None,
                        "finish_reason": "length" if i == 6 else None,
                        "stop_reason": None,
                        "prompt_token_ids": None,  # vLLM 0.32 writes both as null
                        "token_ids": None,
                    }
                ],
            }
            assert json.dumps(chunk, separators=(",", ":")) == payloads[i]  # compact, like vLLM
        assert usage["choices"] == [] and usage["id"] == "cmpl-req-1"
        assert usage["usage"] == {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
        assert fleet.sent_digests["req-1"] == hashlib.sha256(raw).hexdigest()

        # Without include_usage: tokens then [DONE]; token-id prompts count one per id.
        request = {"prompt": [5, 6, 7], "max_tokens": 3, "stream": True}
        response = await client.post(url, json=request)
        payloads = sse_payloads(response.content)
        assert len(payloads) == 4 and payloads[-1] == "[DONE]"
        rid = json.loads(payloads[0])["id"]
        assert rid.startswith("cmpl-") and rid != "cmpl-"
        assert fleet.sent_digests[rid] == hashlib.sha256(response.content).hexdigest()

    run(with_fleet(body, 2, 4, step_model=FAST))


def test_chat_streaming_format() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        request = {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello there world"}]},
            ],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        url = fleet.worker_urls[1] + "/v1/chat/completions"
        response = await client.post(url, json=request, headers={"x-request-id": "chat-1"})
        payloads = sse_payloads(response.content)
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert all(c["id"] == "chatcmpl-chat-1" for c in chunks)
        first, *tokens, usage = chunks
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert [c["choices"][0]["delta"] for c in tokens] == [
            {"content": " tok0"},
            {"content": " tok1"},
            {"content": " tok2"},
        ]
        assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, "length"]
        assert usage["choices"] == []
        assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        assert fleet.sent_digests["chat-1"] == hashlib.sha256(response.content).hexdigest()

    run(with_fleet(body, 2, 4, step_model=FAST))


def test_non_streaming_json_models_health_and_errors() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        base = fleet.worker_urls[0]
        response = await client.post(
            base + "/v1/completions",
            json={"prompt": "a b", "max_tokens": 3},
            headers={"x-request-id": "plain"},
        )
        assert response.status_code == 200
        data = response.json()
        assert data["id"] == "cmpl-plain" and data["object"] == "text_completion"
        assert data["choices"][0]["text"] == " tok0 tok1 tok2"
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"] == {
            "prompt_tokens": 2,
            "completion_tokens": 3,
            "total_tokens": 5,
            "prompt_tokens_details": None,  # vLLM 0.32's non-streaming usage has both
            "completion_tokens_details": None,
        }
        assert fleet.sent_digests["plain"] == hashlib.sha256(response.content).hexdigest()

        chat = await client.post(
            base + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},  # default max_tokens 16
        )
        data = chat.json()
        assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
        message = data["choices"][0]["message"]
        assert message["role"] == "assistant"
        assert message["content"] == "".join(f" tok{i}" for i in range(16))
        assert data["usage"]["completion_tokens"] == 16 and data["usage"]["prompt_tokens"] == 1

        models = (await client.get(base + "/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["emulated-model"]
        assert (await client.get(base + "/health")).status_code == 200
        assert (await client.get(base + "/nope")).status_code == 404
        bad = await client.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 0})
        assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
        bad = await client.post(base + "/v1/completions", content=b"{not json")
        assert bad.status_code == 400
        bad = await client.post(base + "/v1/completions", json={"prompt": []})
        assert bad.status_code == 400
        assert fleet.running(0) == 0 and fleet.waiting(0) == 0

    run(with_fleet(body, 1, 2, step_model=FAST))


def test_batch_limit_and_barrier_step_time() -> None:
    """B + 2 requests on worker 0: 2 wait; T follows a * max_g L_g + b over both workers."""
    model = StepModel(a_ms_per_token=0.02, b_ms=20.0)
    scale = 2.0
    batch = 4
    sink = ListSink()
    prompts = [1000 + i for i in range(batch + 2)]

    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        async def call(worker: int, words: int, tokens: int) -> None:
            request = {"prompt": " ".join(["w"] * words), "max_tokens": tokens}
            response = await client.post(
                fleet.worker_urls[worker] + "/v1/completions", json=request
            )
            assert response.status_code == 200

        tasks = [asyncio.create_task(call(1, 10, 30))]
        tasks += [asyncio.create_task(call(0, p, 8)) for p in prompts]
        await eventually(lambda: fleet.running(0) == batch and fleet.waiting(0) == 2)
        assert fleet.running(1) == 1
        await asyncio.gather(*tasks)

    run(with_fleet(body, 2, batch, step_model=model, time_scale=scale, sink=sink))

    w0, w1 = sink.steps("0"), sink.steps("1")
    assert [e["step"] for e in w0] == [e["step"] for e in w1] == list(range(len(w0)))
    assert max(e["running"] for e in w0) == batch
    assert all(e["running"] <= batch and e["waiting"] <= 2 for e in w0)
    assert any(e["running"] == batch and e["waiting"] == 2 for e in w0)
    # Each request decodes 8 steps, reading prompt + j KV tokens at its j-th step.
    assert sum(e["running"] for e in w0) == 8 * len(prompts)
    assert sum(e["kv_tokens"] for e in w0) == sum(8 * p + 28 for p in prompts)
    # Worker 1 runs one light request from the step it is admitted: load 10 + k.
    loads1 = [e["kv_tokens"] for e in w1 if e["running"]]
    assert loads1 == [10 + k for k in range(30)]
    # The barrier: every step lasts (a * max_g L_g + b) / time_scale.
    errors, targets = [], []
    for a, b in zip(w0, w1, strict=True):
        assert a["duration_ms"] == b["duration_ms"]
        target = model.step_ms(max(a["kv_tokens"], b["kv_tokens"])) / scale
        targets.append(target)
        errors.append(a["duration_ms"] - target)
        assert a["duration_ms"] >= target - 1.0  # sleeps wake up to 1 ms late, learned
    assert max(targets) > 2 * min(targets)  # the load really moved the step time
    # Timers only ever wake late, and a busy machine adds delay: judge the typical step.
    assert statistics.quantiles(errors, n=4)[0] < 2.0
    assert statistics.median(e / t for e, t in zip(errors, targets, strict=True)) < 0.25


def test_waiting_requests_are_admitted_first_in_first_out() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        order: list[str] = []

        async def call(rid: str) -> None:
            request = {"prompt": "a", "max_tokens": 4}
            url = fleet.worker_urls[0] + "/v1/completions"
            await client.post(url, json=request, headers={"x-request-id": rid})
            order.append(rid)

        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(call(f"r{i}")))
            await eventually(lambda i=i: fleet.running(0) + fleet.waiting(0) == i + 1)
        await asyncio.gather(*tasks)
        assert order == ["r0", "r1", "r2", "r3"]

    run(with_fleet(body, 1, 1, step_model=StepModel(a_ms_per_token=0, b_ms=15.0)))


def test_metrics_are_vllm_named_and_parse() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[1]
        request = {"prompt": " ".join(["w"] * 100), "max_tokens": 40, "stream": True}
        tasks = [
            asyncio.create_task(client.post(url + "/v1/completions", json=request))
            for _ in range(3)
        ]
        await eventually(lambda: fleet.running(1) == 2 and fleet.waiting(1) == 1)
        families = {f.name: f for f in text_string_to_metric_families(
            (await client.get(url + "/metrics")).text)}  # fmt: skip
        labels = {"model_name": "emulated-model", "engine": "1"}

        def value(name: str, sample: str | None = None, **extra: str) -> float:
            for s in families[name].samples:
                if s.name == (sample or name) and s.labels == {**labels, **extra}:
                    return s.value
            raise AssertionError(f"{name} {extra} not exported")

        assert value("vllm:num_requests_running") == 2
        assert value("vllm:num_requests_waiting") == 1
        assert 0 < value("vllm:kv_cache_usage_perc") <= 1
        assert value("vllm:prompt_tokens", "vllm:prompt_tokens_total") == 200
        await asyncio.gather(*tasks)

        families = {f.name: f for f in text_string_to_metric_families(
            (await client.get(url + "/metrics")).text)}  # fmt: skip
        assert families["vllm:num_requests_running"].type == "gauge"
        assert families["vllm:generation_tokens"].type == "counter"
        assert families["vllm:inter_token_latency_seconds"].type == "histogram"
        assert value("vllm:num_requests_running") == 0
        assert value("vllm:generation_tokens", "vllm:generation_tokens_total") == 120
        assert value("vllm:prompt_tokens", "vllm:prompt_tokens_total") == 300
        success = "vllm:request_success_total"
        assert value("vllm:request_success", success, finished_reason="length") == 3
        itl = "vllm:inter_token_latency_seconds_count"
        assert value("vllm:inter_token_latency_seconds", itl) == 3 * 39
        # Workers do not share metrics.
        other = (await client.get(fleet.worker_urls[0] + "/metrics")).text
        assert 'vllm:generation_tokens_total{engine="0",model_name="emulated-model"} 0.0' in other

    run(with_fleet(body, 2, 2, step_model=FAST, kv_capacity_tokens=10_000))


def test_client_disconnect_frees_the_slot_at_once() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0] + "/v1/completions"
        long = {"prompt": "x", "max_tokens": 100_000, "stream": True}
        queued = asyncio.create_task(
            client.post(url, json={"prompt": "y", "max_tokens": 3, "stream": True})
        )
        async with client.stream("POST", url, json=long, headers={"x-request-id": "gone"}) as r:
            await eventually(lambda: fleet.waiting(0) == 1)
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: {")
                if seen == 3:
                    break
        # Closing the half-read response drops the connection; the queued request gets the slot.
        response = await asyncio.wait_for(queued, timeout=5)
        assert sse_payloads(response.content)[-1] == "[DONE]"
        assert fleet.cancelled == 1
        assert fleet.running(0) == 0 and fleet.waiting(0) == 0
        assert "gone" in fleet.sent_digests

    run(with_fleet(body, 1, 1, step_model=FAST))


def test_kill_worker_breaks_its_streams_while_the_rest_finish() -> None:
    sink = ListSink()

    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        async def stream(worker: int, tokens: int) -> tuple[int, bool, bool]:
            """(token chunks, saw [DONE], broke with a transport error)"""
            url = fleet.worker_urls[worker] + "/v1/completions"
            chunks, done = 0, False
            try:
                request = {"prompt": "p q", "max_tokens": tokens, "stream": True}
                async with client.stream("POST", url, json=request) as response:
                    async for line in response.aiter_lines():
                        chunks += line.startswith("data: {")
                        done = done or line == "data: [DONE]"
            except httpx.TransportError:
                return chunks, done, True
            return chunks, done, False

        doomed = [asyncio.create_task(stream(0, 10_000)) for _ in range(3)]  # 2 run, 1 waits
        survivors = [asyncio.create_task(stream(1, 60)) for _ in range(2)]
        await eventually(lambda: fleet.running(0) == 2 and fleet.waiting(0) == 1)
        await eventually(lambda: fleet.steps >= 5)
        fleet.kill_worker(0)
        assert fleet.running(0) == 0 and fleet.waiting(0) == 0 and not fleet.alive(0)
        for chunks, done, broke in await asyncio.gather(*doomed):
            assert not done and (broke or chunks < 10_000)
        for chunks, done, broke in await asyncio.gather(*survivors):
            assert (chunks, done, broke) == (60, True, False)
        with pytest.raises(httpx.ConnectError):
            await client.get(fleet.worker_urls[0] + "/health")
        assert fleet.cancelled == 0  # a crash is not a client cancellation

    run(with_fleet(body, 2, 2, step_model=FAST, sink=sink))
    steps0 = sink.steps("0")
    last0 = steps0[-1]["step"]
    assert [e["step"] for e in sink.steps("1") if e["step"] > last0]  # worker 1 kept stepping


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        EmulatedFleet(0, 4)
    with pytest.raises(ValueError):
        EmulatedFleet(2, 4, time_scale=0)
