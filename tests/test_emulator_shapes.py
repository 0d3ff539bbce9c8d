"""The emulated engines send what real vLLM 0.32 sends, over real loopback HTTP: the key
layout of every chunk and body (compared with lines captured from a real vLLM 0.32 server
serving the tiny model), multi-token and empty-text chunks, usage chunks, error chunks,
every finish reason, non-streaming answers, n > 1, ids and the data-parallel rank."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shadow.replay.workload import StepModel
from shadow.world.emulator import EmulatedFleet

LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None)
FAST = StepModel(a_ms_per_token=1e-4, b_ms=2.0)

# Lines a real vLLM 0.32 server wrote (CPU build, tiny model, --data-parallel-size 2),
# text shortened to ASCII: only their layout is compared.
REAL_CMPL_CHUNK = (
    '{"id":"cmpl-abc","object":"text_completion","created":1796118442,"model":"tiny",'
    '"choices":[{"index":0,"text":"ade","logprobs":null,"finish_reason":null,'
    '"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}'
)
REAL_CMPL_FINISH_USAGE = (
    '{"id":"cmpl-abc","object":"text_completion","created":1796118442,"model":"tiny",'
    '"choices":[{"index":0,"text":"  ","logprobs":null,"finish_reason":"length",'
    '"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}'
)
REAL_CMPL_FINISH_NO_USAGE = (
    '{"id":"cmpl-add2","object":"text_completion","created":1796118443,"model":"tiny",'
    '"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop",'
    '"stop_reason":117,"prompt_token_ids":null,"token_ids":null}],'
    '"system_fingerprint":"vllm-0.32.0-dp2-62c1d947"}'
)
REAL_CMPL_CONTINUOUS = (
    '{"id":"cmpl-8e98","object":"text_completion","created":1796118442,"model":"tiny",'
    '"choices":[{"index":0,"text":"ot","logprobs":null,"finish_reason":null,'
    '"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],'
    '"usage":{"prompt_tokens":6,"total_tokens":7,"completion_tokens":1}}'
)
REAL_USAGE_CHUNK = (
    '{"id":"cmpl-abc","object":"text_completion","created":1796118442,"model":"tiny",'
    '"choices":[],"usage":{"prompt_tokens":6,"total_tokens":13,"completion_tokens":7},'
    '"system_fingerprint":"vllm-0.32.0-dp2-62c1d947"}'
)
REAL_CHAT_ROLE_CONTINUOUS = (
    '{"id":"chatcmpl-chat1","object":"chat.completion.chunk","created":1796118443,'
    '"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    '"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":18,"total_tokens":18,'
    '"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,'
    '"prompt_text":null}'
)
REAL_CHAT_CONTENT_CONTINUOUS = (
    '{"id":"chatcmpl-chat1","object":"chat.completion.chunk","created":1796118443,'
    '"model":"tiny","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,'
    '"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":18,"total_tokens":19,'
    '"completion_tokens":1,"completion_tokens_details":null}}'
)
REAL_CHAT_ROLE = (
    '{"id":"chatcmpl-9a7b","object":"chat.completion.chunk","created":1796118443,'
    '"model":"tiny","choices":[{"index":1,"delta":{"role":"assistant","content":""},'
    '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}'
)
REAL_CHAT_FINISH_NO_USAGE = (
    '{"id":"chatcmpl-9a7b","object":"chat.completion.chunk","created":1796118443,'
    '"model":"tiny","choices":[{"index":1,"delta":{"content":""},"logprobs":null,'
    '"finish_reason":"length","stop_reason":null,"token_ids":null}],'
    '"system_fingerprint":"vllm-0.32.0-dp2-62c1d947"}'
)
REAL_CMPL_BODY_N2 = (
    '{"id":"cmpl-plain","object":"text_completion","created":1796118443,"model":"tiny",'
    '"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":"length",'
    '"stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,'
    '"routed_experts":null},{"index":1,"text":"b","logprobs":null,"finish_reason":"length",'
    '"stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,'
    '"routed_experts":null}],"service_tier":null,'
    '"system_fingerprint":"vllm-0.32.0-dp2-62c1d947","usage":{"prompt_tokens":3,'
    '"total_tokens":9,"completion_tokens":6,"prompt_tokens_details":null,'
    '"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,'
    '"metrics":null}'
)
REAL_CHAT_BODY = (
    '{"id":"chatcmpl-bb1e","object":"chat.completion","created":1796118443,"model":"tiny",'
    '"choices":[{"index":0,"message":{"role":"assistant","content":"x","refusal":null,'
    '"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,'
    '"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],'
    '"service_tier":null,"system_fingerprint":"vllm-0.32.0-dp2-62c1d947","usage":'
    '{"prompt_tokens":18,"total_tokens":21,"completion_tokens":3,"prompt_tokens_details":null,'
    '"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,'
    '"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
)
# vLLM writes a mid-stream error with json.dumps (spaced), then [DONE].
REAL_ERROR_TAIL = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\ndata: [DONE]\n\n'
)


def layout(value: Any) -> Any:
    """The keys of `value`, in order, all the way down (values other than containers and
    null are left out: only where fields sit and which are null is compared)."""
    if isinstance(value, dict):
        return [(k, layout(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [layout(v) for v in value[:1]]
    return None if value is None else "value"


def same_layout(line: bytes | str, real: str) -> bool:
    return layout(json.loads(line)) == layout(json.loads(real))


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


def payloads(raw: bytes) -> list[str]:
    assert raw.endswith(b"\n\n")
    events = raw.decode().split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def chunks(raw: bytes) -> list[dict[str, Any]]:
    lines = payloads(raw)
    assert lines[-1] == "[DONE]"
    return [json.loads(p) for p in lines[:-1]]


def completions(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "one two three", "max_tokens": max_tokens, **extra}


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hello there"}]
    return {"model": "m", "messages": messages, "max_tokens": max_tokens, **extra}


USAGE = {"include_usage": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def test_default_chunks_have_real_vllm_layout() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0]
        stop = {"emulate_finish_reason": "stop", "emulate_stop_reason": 117}
        request = completions(3, stream=True, vllm_xargs=stop)
        lines = payloads((await client.post(url + "/v1/completions", json=request)).content)
        assert same_layout(lines[0], REAL_CMPL_CHUNK)
        assert same_layout(lines[2], REAL_CMPL_FINISH_NO_USAGE)  # finish carries the fingerprint
        assert json.loads(lines[2])["choices"][0]["text"] == ""
        request = completions(3, stream=True, stream_options=USAGE)
        lines = payloads((await client.post(url + "/v1/completions", json=request)).content)
        assert same_layout(lines[2], REAL_CMPL_FINISH_USAGE)  # the usage chunk has the print
        assert same_layout(lines[3], REAL_USAGE_CHUNK)
        request = completions(3, stream=True, stream_options=CONTINUOUS)
        lines = payloads((await client.post(url + "/v1/completions", json=request)).content)
        assert all(same_layout(line, REAL_CMPL_CONTINUOUS) for line in lines[:2])
        assert [json.loads(line)["usage"]["completion_tokens"] for line in lines[:3]] == [1, 2, 3]
        assert same_layout(lines[3], REAL_USAGE_CHUNK)

        request = chat(2, stream=True, stream_options=CONTINUOUS)
        lines = payloads((await client.post(url + "/v1/chat/completions", json=request)).content)
        assert same_layout(lines[0], REAL_CHAT_ROLE_CONTINUOUS)
        assert json.loads(lines[0])["usage"]["completion_tokens"] == 0  # the role is no token
        assert same_layout(lines[1], REAL_CHAT_CONTENT_CONTINUOUS)
        request = chat(2, stream=True)
        lines = payloads((await client.post(url + "/v1/chat/completions", json=request)).content)
        assert same_layout(lines[0], REAL_CHAT_ROLE)
        assert same_layout(lines[2], REAL_CHAT_FINISH_NO_USAGE)
        assert lines[-1] == "[DONE]" and len(lines) == 4

        plain = await client.post(url + "/v1/completions", json=completions(3, n=2))
        assert same_layout(plain.content, REAL_CMPL_BODY_N2)
        plain = await client.post(url + "/v1/chat/completions", json=chat(3))
        assert same_layout(plain.content, REAL_CHAT_BODY)

    run(with_fleet(body, 1, 4, step_model=FAST))


def test_stream_interval_sends_multi_token_chunks_counted_by_usage() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0] + "/v1/completions"
        request = completions(11, stream=True, stream_options=CONTINUOUS)
        got = chunks((await client.post(url, json=request)).content)
        tokens, usage = got[:-1], got[-1]
        counts = [c["usage"]["completion_tokens"] for c in tokens]
        # vLLM's --stream-interval 3: the first token at once, then 3 at a time, the rest at
        # the finish
        assert counts == [1, 4, 7, 10, 11]
        assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 4 + ["length"]
        assert usage["usage"]["completion_tokens"] == 11
        text = "".join(c["choices"][0]["text"] for c in tokens)
        assert text == "".join(f" tok{j}" for j in range(11))
        plain = (await client.post(url, json=completions(11))).json()
        assert plain["choices"][0]["text"] == text

    run(with_fleet(body, 1, 4, step_model=FAST, stream_interval=3))


def test_a_lagging_stream_merges_outputs() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0] + "/v1/chat/completions"
        request = chat(40, stream=True, stream_options=CONTINUOUS)
        got = chunks((await client.post(url, json=request)).content)
        role, tokens, usage = got[0], got[1:-1], got[-1]
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        counts = [c["usage"]["completion_tokens"] for c in tokens]
        steps = [b - a for a, b in zip([0, *counts], counts, strict=False)]
        assert counts[-1] == 40 and usage["usage"]["completion_tokens"] == 40
        assert len(tokens) < 40 and max(steps) > 1  # chunks carry several tokens
        assert min(steps) >= 1
        text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
        assert text == "".join(f" tok{j}" for j in range(40))

    model = StepModel(a_ms_per_token=0, b_ms=1.0)
    run(with_fleet(body, 1, 2, step_model=model, merge_outputs=True, stream_lag_s=0.01))


def test_tokens_ending_mid_utf8_stream_as_empty_text() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0] + "/v1/completions"
        raw = (await client.post(url, json=completions(9, stream=True))).content
        texts = [c["choices"][0]["text"] for c in chunks(raw)]
        assert len(texts) == 9  # one chunk per token, some of them empty
        assert [i for i, t in enumerate(texts) if t == ""] == [2, 5]
        assert texts[3] == " tok2\u00e9 tok3"  # the next token completes the character
        plain = (await client.post(url, json=completions(9))).json()
        assert plain["choices"][0]["text"] == "".join(texts)
        assert "\u00e9".encode() in raw  # raw UTF-8, as pydantic writes it

    run(with_fleet(body, 1, 2, step_model=FAST, split_utf8_every=3))


def test_n_choices_run_as_n_engine_requests() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0]
        request = chat(5, n=3, stream=True, stream_options=USAGE)
        task = asyncio.create_task(
            client.post(url + "/v1/chat/completions", json=request, headers={"x-request-id": "nn"})
        )
        for _ in range(500):
            if fleet.running(0) == 3:
                break
            await asyncio.sleep(0.002)
        assert fleet.running(0) == 3  # three slots for one HTTP request
        assert fleet.request_keys(0) == ["chatcmpl-nn"] * 3  # each reports the parent's id
        got = chunks((await task).content)
        roles = [c for c in got[:3]]
        assert [c["choices"][0]["index"] for c in roles] == [0, 1, 2]
        assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": ""} for c in roles)
        by_choice: dict[int, list[dict[str, Any]]] = {0: [], 1: [], 2: []}
        for c in got[3:-1]:
            assert len(c["choices"]) == 1
            by_choice[c["choices"][0]["index"]].append(c["choices"][0])
        for choice in by_choice.values():
            assert len(choice) == 5 and choice[-1]["finish_reason"] == "length"
        assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] == 15

        plain = await client.post(
            url + "/v1/completions", json=completions(4, n=2), headers={"x-request-id": "p2"}
        )
        data = plain.json()
        assert data["id"] == "cmpl-p2"
        assert [c["index"] for c in data["choices"]] == [0, 1]
        assert all(c["text"] == " tok0 tok1 tok2 tok3" for c in data["choices"])
        assert data["usage"]["completion_tokens"] == 8 and data["usage"]["prompt_tokens"] == 3

    run(with_fleet(body, 1, 4, step_model=StepModel(a_ms_per_token=0, b_ms=10.0)))


@pytest.mark.parametrize(
    ("endpoint", "reason", "stop_reason"),
    [
        ("completions", "stop", None),
        ("completions", "stop", 117),
        ("completions", "stop", "recomputed"),
        ("completions", "length", None),
        ("completions", "abort", None),
        ("completions", "repetition", None),
        ("chat", "tool_calls", None),
        ("chat", "stop", "recomputed"),
    ],
)
def test_every_finish_reason(endpoint: str, reason: str, stop_reason: Any) -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        is_chat = endpoint == "chat"
        path = "/v1/chat/completions" if is_chat else "/v1/completions"
        xargs: dict[str, Any] = {"emulate_finish_reason": reason, "emulate_output_tokens": 4}
        if stop_reason is not None:
            xargs["emulate_stop_reason"] = stop_reason
        make = chat if is_chat else completions
        request = make(10, stream=True, vllm_xargs=xargs, stream_options=USAGE)
        got = chunks((await client.post(fleet.worker_urls[0] + path, json=request)).content)
        outputs = got[1:-1] if is_chat else got[:-1]
        assert len(outputs) == 4 and got[-1]["usage"]["completion_tokens"] == 4
        last = outputs[-1]["choices"][0]
        assert last["finish_reason"] == reason and last["stop_reason"] == stop_reason
        assert all(c["choices"][0]["finish_reason"] is None for c in outputs[:-1])
        if reason == "tool_calls":
            calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in outputs]
            assert calls[0]["id"].startswith("chatcmpl-tool-") and calls[0]["type"] == "function"
            assert calls[0]["function"]["name"] == "emulated_tool"
            assert all(set(call) == {"index", "function"} for call in calls[1:])
        elif reason in ("stop", "repetition"):
            text = last["delta"]["content"] if is_chat else last["text"]
            assert text == ""  # the stop token is not output

        plain = await client.post(fleet.worker_urls[0] + path, json=make(10, vllm_xargs=xargs))
        choice = plain.json()["choices"][0]
        assert choice["finish_reason"] == reason and choice["stop_reason"] == stop_reason
        assert plain.json()["usage"]["completion_tokens"] == 4
        if reason == "tool_calls":
            assert choice["message"]["content"] is None
            assert choice["message"]["tool_calls"][0]["function"]["name"] == "emulated_tool"

        families = {f.name: f for f in text_string_to_metric_families(
            (await client.get(fleet.worker_urls[0] + "/metrics")).text)}  # fmt: skip
        success = {
            s.labels["finished_reason"]: s.value
            for s in families["vllm:request_success"].samples
            if s.name.endswith("_total")
        }
        assert success[reason] == 2 and sum(success.values()) == 2

    run(with_fleet(body, 1, 4, step_model=FAST))


def test_engine_failure_sends_an_error_chunk_then_done() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0] + "/v1/completions"
        xargs = {"emulate_fail_after": 3}
        request = completions(10, stream=True, stream_options=USAGE, vllm_xargs=xargs)
        raw = (await client.post(url, json=request)).content
        assert raw.endswith(REAL_ERROR_TAIL)  # no usage chunk: the error ends the stream
        lines = payloads(raw[: -len(REAL_ERROR_TAIL)])
        assert [json.loads(line)["choices"][0]["text"] for line in lines] == [" tok0", " tok1"]
        plain = await client.post(url, json=completions(10, vllm_xargs=xargs))
        assert plain.status_code == 500
        assert plain.json()["error"] == {
            "message": "Internal server error",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }

        # An injected fault on the engine fails what it holds; the worker serves on.
        async with client.stream("POST", url, json=completions(10_000, stream=True)) as r:
            received, failed = b"", 0
            async for part in r.aiter_raw():
                received += part
                if not failed and received.count(b"data: {") >= 2:
                    failed = fleet.fail_requests(0)
            assert failed == 1 and received.endswith(REAL_ERROR_TAIL)
        assert fleet.alive(0) and fleet.running(0) == 0
        after = await client.post(url, json=completions(2))
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 2

    run(with_fleet(body, 1, 2, step_model=FAST))


def test_ids_come_from_x_request_id() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0]
        headers = {"x-request-id": "base7"}
        task = asyncio.create_task(
            client.post(url + "/v1/completions", json=completions(20), headers=headers)
        )
        for _ in range(500):
            if fleet.running(0):
                break
            await asyncio.sleep(0.002)
        assert fleet.request_keys(0) == ["cmpl-base7-0"]  # the engine's external id
        assert (await task).json()["id"] == "cmpl-base7"
        task = asyncio.create_task(
            client.post(url + "/v1/chat/completions", json=chat(20), headers=headers)
        )
        for _ in range(500):
            if fleet.running(0):
                break
            await asyncio.sleep(0.002)
        assert fleet.request_keys(0) == ["chatcmpl-base7"]
        assert (await task).json()["id"] == "chatcmpl-base7"

    run(with_fleet(body, 1, 2, step_model=StepModel(a_ms_per_token=0, b_ms=5.0)))


def test_data_parallel_front_pins_ranks_and_shows_every_engine() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        assert fleet.dp_url is not None
        url = fleet.dp_url + "/v1/completions"
        pinned = [
            asyncio.create_task(
                client.post(url, json=completions(30), headers={"X-data-parallel-rank": "1"})
            )
            for _ in range(2)
        ]
        for _ in range(500):
            if fleet.running(1) == 2:
                break
            await asyncio.sleep(0.002)
        assert fleet.running(1) == 2 and fleet.running(0) == 0
        # Unpinned, vLLM's balancer picks the engine with the lowest 4 * waiting + running.
        free = asyncio.create_task(client.post(url, json=completions(30)))
        for _ in range(500):
            if fleet.running(0) == 1:
                break
            await asyncio.sleep(0.002)
        assert fleet.running(0) == 1
        page = (await client.get(fleet.dp_url + "/metrics")).text
        running = {
            s.labels["engine"]: s.value
            for f in text_string_to_metric_families(page)
            if f.name == "vllm:num_requests_running"
            for s in f.samples
        }
        assert running == {"0": 1.0, "1": 2.0}
        own = (await client.get(fleet.worker_urls[1] + "/metrics")).text
        assert 'engine="1"' in own and 'engine="0"' not in own
        for task in [*pinned, free]:
            assert (await task).status_code == 200

        bad = await client.post(url, json=completions(2), headers={"X-data-parallel-rank": "5"})
        assert bad.status_code == 400
        assert bad.json()["error"]["message"] == "data_parallel_rank 5 is out of range [0, 2)."
        bad = await client.post(url, json=completions(2), headers={"X-data-parallel-rank": "x"})
        assert bad.status_code == 400 and "X-data-parallel-rank" in bad.json()["error"]["message"]
        single = fleet.worker_urls[0] + "/v1/completions"
        bad = await client.post(single, json=completions(2), headers={"X-data-parallel-rank": "1"})
        assert bad.status_code == 400 and "data_parallel_rank 1" in bad.json()["error"]["message"]
        ok = await client.post(single, json=completions(2), headers={"X-data-parallel-rank": "0"})
        assert ok.status_code == 200

    run(with_fleet(body, 2, 4, step_model=StepModel(a_ms_per_token=0, b_ms=5.0), dp_front=True))


def test_metrics_add_waiting_by_reason_and_iteration_tokens() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0]
        tasks = [
            asyncio.create_task(client.post(url + "/v1/completions", json=completions(6)))
            for _ in range(3)
        ]
        for _ in range(500):
            if fleet.running(0) == 2 and fleet.waiting(0) == 1:
                break
            await asyncio.sleep(0.002)
        page = (await client.get(url + "/metrics")).text
        waiting = {
            s.labels["reason"]: s.value
            for f in text_string_to_metric_families(page)
            if f.name == "vllm:num_requests_waiting_by_reason"
            for s in f.samples
        }
        assert waiting == {"capacity": 1.0, "deferred": 0.0}
        await asyncio.gather(*tasks)
        page = (await client.get(url + "/metrics")).text
        samples = {
            s.name: s.value
            for f in text_string_to_metric_families(page)
            if f.name == "vllm:iteration_tokens_total"
            for s in f.samples
        }
        # 2 requests for 6 steps, then 1 for 6: 12 steps; tokens: 18 decoded + 3 * 3 prompt
        assert samples["vllm:iteration_tokens_total_count"] == 12
        assert samples["vllm:iteration_tokens_total_sum"] == 18 + 9

    run(with_fleet(body, 1, 2, step_model=StepModel(a_ms_per_token=0, b_ms=5.0)))


def test_bad_controls_are_refused_naming_the_field() -> None:
    async def body(fleet: EmulatedFleet, client: httpx.AsyncClient) -> None:
        url = fleet.worker_urls[0]
        cases = [
            ("/v1/completions", completions(4, n=0), "n"),
            ("/v1/completions", completions(4, vllm_xargs={"emulate_finish_reason": "tool_calls"}),
             "vllm_xargs.emulate_finish_reason"),
            ("/v1/chat/completions", chat(4, vllm_xargs={"emulate_finish_reason": "eos"}),
             "vllm_xargs.emulate_finish_reason"),
            ("/v1/completions", completions(4, vllm_xargs={"emulate_output_tokens": 5}),
             "vllm_xargs.emulate_output_tokens"),
            ("/v1/completions", completions(4, vllm_xargs={"emulate_fail_after": 0}),
             "vllm_xargs.emulate_fail_after"),
            ("/v1/completions", completions(4, stream_options=True), "stream_options"),
        ]  # fmt: skip
        for path, request, field in cases:
            response = await client.post(url + path, json=request)
            assert response.status_code == 400, field
            error = response.json()["error"]
            assert error["param"] == field and field in error["message"]
        assert fleet.running(0) == 0 and fleet.waiting(0) == 0

    run(with_fleet(body, 1, 2, step_model=FAST))


def test_shape_options_are_validated() -> None:
    with pytest.raises(ValueError, match="stream_interval"):
        EmulatedFleet(1, 1, stream_interval=0)
    with pytest.raises(ValueError, match="split_utf8_every"):
        EmulatedFleet(1, 1, split_utf8_every=1)
    with pytest.raises(ValueError, match="stream_lag_s"):
        EmulatedFleet(1, 1, stream_lag_s=-1)


@pytest.mark.parametrize("chat_endpoint", [False, True])
def test_the_fast_chunk_template_writes_what_the_dict_would(chat_endpoint: bool) -> None:
    """The common chunk is cut from byte templates; they must equal the full build."""
    from shadow.world import vllm_wire

    shape = vllm_wire.StreamShape("cmpl-x", 1, "m", chat_endpoint, 3, False, False, "fp")
    for index in (0, 2):
        for text in (" tok5", "", ' "q"\\ \u00e9\n\u0000'):
            fast = shape.chunk(index, text, 4, None, None)
            assert fast == shape._build(index, text, 4, None, None, None)
            assert json.loads(fast[len(b"data: ") :])["choices"][0]["index"] == index
