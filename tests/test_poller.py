"""The metrics poller: vLLM exposition parsing, and scraping a real server on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from shadow.connectors.poller import (
    EngineSample,
    MetricsPoller,
    Target,
    parse_vllm_metrics,
    select_sample,
)
from tests.service_helpers import ThreadedServer

# What vLLM V1 (0.9+) serves for a data-parallel deployment of two engines: HELP/TYPE
# lines, counters with `_total` and `_created`, histograms, an info metric.
CURRENT = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 17.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 64.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.125
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.9375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0e4
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 48213.0
vllm:generation_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.5e6
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7e9
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 41.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 41.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="27000"} 1.0
"""  # noqa: E501

# vLLM before 0.9 (V0): no engine label, `gpu_cache_usage_perc`, no TYPE on some lines.
OLD = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="mistralai/Mistral-7B-v0.1"} 3.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="mistralai/Mistral-7B-v0.1"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="mistralai/Mistral-7B-v0.1"} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="mistralai/Mistral-7B-v0.1"} 0.4
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="mistralai/Mistral-7B-v0.1"} 2.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="mistralai/Mistral-7B-v0.1"} 2.0
vllm:e2e_request_latency_seconds_count{model_name="mistralai/Mistral-7B-v0.1"} 2.0
vllm:e2e_request_latency_seconds_sum{model_name="mistralai/Mistral-7B-v0.1"} 1.5
vllm:generation_tokens_total{model_name="mistralai/Mistral-7B-v0.1"} 777.0
"""


def metrics_text(running: float, waiting: float, engine: str = "0", kv: float = 0.5) -> str:
    labels = f'engine="{engine}",model_name="m"'
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv}\n"
        "# TYPE vllm:generation_tokens counter\n"
        f"vllm:generation_tokens_total{{{labels}}} 100.0\n"
    )


# --- parsing -------------------------------------------------------------------------------


def test_parse_current_names_two_engines() -> None:
    samples = parse_vllm_metrics(CURRENT)
    assert samples == {
        "0": EngineSample(running=17.0, waiting=0.0, kv_usage=0.125, generation_tokens=48213.0),
        "1": EngineSample(running=64.0, waiting=5.0, kv_usage=0.9375, generation_tokens=1.5e6),
    }


def test_parse_old_names_without_engine_label() -> None:
    assert parse_vllm_metrics(OLD) == {
        "0": EngineSample(running=3.0, waiting=2.0, kv_usage=0.4, generation_tokens=777.0)
    }


def test_current_kv_name_wins_over_old() -> None:
    text = (
        OLD
        + "# TYPE vllm:kv_cache_usage_perc gauge\n"
        + ('vllm:kv_cache_usage_perc{model_name="mistralai/Mistral-7B-v0.1"} 0.75\n')
    )
    assert parse_vllm_metrics(text)["0"].kv_usage == 0.75


def test_missing_optional_metrics_are_none() -> None:
    text = (
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="3"} 1\n'
        '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="3"} 0\n'
    )
    assert parse_vllm_metrics(text) == {"3": EngineSample(1.0, 0.0, None, None)}


def test_several_model_names_keyed_by_engine() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="base"} 2',
            'vllm:num_requests_running{engine="1",model_name="lora-a"} 4',
            'vllm:num_requests_running{engine="1",model_name="lora-b"} 1',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="base"} 0',
            'vllm:num_requests_waiting{engine="1",model_name="lora-a"} 3',
            'vllm:num_requests_waiting{engine="1",model_name="lora-b"} 2',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="1",model_name="lora-a"} 0.5',
            'vllm:kv_cache_usage_perc{engine="1",model_name="lora-b"} 0.25',
            "",
        ]
    )
    samples = parse_vllm_metrics(text)
    assert set(samples) == {"0", "1"}
    assert samples["0"] == EngineSample(2.0, 0.0, None, None)
    assert samples["1"] == EngineSample(5.0, 5.0, 0.5, None)


@pytest.mark.parametrize(
    "text",
    ["<html><body>502 Bad Gateway</body></html>", "vllm:num_requests_running{engine= 3", "{}"],
)
def test_garbage_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not Prometheus text exposition"):
        parse_vllm_metrics(text)


def test_text_without_vllm_metrics_has_no_engines() -> None:
    assert parse_vllm_metrics("# TYPE up gauge\nup 1\n") == {}
    with pytest.raises(ValueError, match="no vLLM engine metrics"):
        select_sample(Target("w0", "http://x"), {})


def test_select_sample_by_engine_label() -> None:
    samples = parse_vllm_metrics(CURRENT)
    assert select_sample(Target("1", "http://x"), samples).running == 64.0
    assert select_sample(Target("w9", "http://x"), samples).running == 17.0  # first engine
    assert select_sample(Target("w9", "http://x", engine="1"), samples).running == 64.0
    with pytest.raises(ValueError, match="engine '7'"):
        select_sample(Target("w9", "http://x", engine="7"), samples)
    assert Target("w0", "http://h:8000/").metrics_url == "http://h:8000/metrics"


def test_poller_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        MetricsPoller([Target("w0", "http://a"), Target("w0", "http://b")])
    with pytest.raises(ValueError, match="interval_s"):
        MetricsPoller([Target("w0", "http://a")], interval_s=0)


# --- a real server on loopback --------------------------------------------------------------


class MetricsServer:
    """A /metrics endpoint in a uvicorn thread whose behaviour the test switches."""

    def __init__(self, port: int = 0) -> None:
        self.mode = "ok"  # ok | error | hang | garbage
        self.running = 1.0
        self.hits = 0
        self.release = threading.Event()
        self.port = port
        self._http: ThreadedServer | None = None

    async def _metrics(self, request: Request) -> Response:
        self.hits += 1
        if self.mode == "error":
            return PlainTextResponse("engine dead", status_code=500)
        if self.mode == "garbage":
            return PlainTextResponse("<html>maintenance</html>")
        if self.mode == "hang":
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        return PlainTextResponse(metrics_text(self.running, 2.0))

    def start(self) -> MetricsServer:
        app = Starlette(routes=[Route("/metrics", self._metrics)])
        self._http = ThreadedServer(app, port=self.port, timeout_graceful_shutdown=1).start()
        self.port = self._http.port
        return self

    def stop(self) -> None:
        self.release.set()
        if self._http is not None:
            self._http.stop()
        self._http = None
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def server():
    srv = MetricsServer().start()
    yield srv
    srv.stop()


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_samples_arrive_stale_on_failure_and_recover(server: MetricsServer) -> None:
    received: list[tuple[str, float, EngineSample]] = []

    async def scenario() -> None:
        poller = MetricsPoller(
            [Target("w0", server.url)],
            interval_s=0.05,
            timeout_s=0.2,
            staleness_s=0.4,
            on_sample=lambda w, ts, s: received.append((w, ts, s)),
        )
        async with poller:
            await wait_until(lambda: len(received) >= 3)
            worker, ts, sample = received[-1]
            assert worker == "w0" and abs(ts - time.time()) < 1.0
            assert sample == EngineSample(1.0, 2.0, 0.5, 100.0)
            assert not poller.stale("w0")
            assert poller.failures == {"w0": 0}

            # Each failure mode: the poller keeps the last good sample, counts failures,
            # turns stale after staleness_s, keeps running, and recovers when it answers.
            for mode, error in (
                ("error", "HTTP 500"),
                ("garbage", "not Prometheus"),
                ("hang", "timeout"),
            ):
                server.mode = mode
                failures = poller.failures["w0"]
                await wait_until(lambda: poller.stale("w0"))
                status = poller.status()["w0"]
                assert status["stale"] and status["age_s"] > 0.4
                assert status["failures"] > failures
                assert error in status["last_error"]
                assert status["sample"]["running"] == server.running  # last good one kept
                assert poller.running
                server.release.set()
                server.mode = "ok"
                server.running += 1
                await wait_until(lambda: not poller.stale("w0"))
                server.release.clear()
                assert received[-1][2].running == server.running
                assert poller.status()["w0"]["consecutive_failures"] == 0

    asyncio.run(scenario())


def test_server_shut_down_then_back_on_the_same_port(server: MetricsServer) -> None:
    async def scenario() -> None:
        poller = MetricsPoller(
            [Target("w0", server.url)], interval_s=0.05, timeout_s=0.2, staleness_s=0.3
        )
        await poller.start()
        try:
            await wait_until(lambda: poller.latest("w0") is not None)
            await asyncio.to_thread(server.stop)
            await wait_until(lambda: poller.stale("w0"))
            assert "Connect" in poller.status()["w0"]["last_error"]
            server.running = 9.0
            await asyncio.to_thread(server.start)
            await wait_until(lambda: not poller.stale("w0"))
            latest = poller.latest("w0")
            assert latest is not None and latest[1].running == 9.0
        finally:
            await poller.stop()
        assert not poller.running

    asyncio.run(scenario())


def test_a_hanging_target_does_not_delay_the_others(server: MetricsServer) -> None:
    slow = MetricsServer().start()
    slow.mode = "hang"
    counts = {"fast": 0, "slow": 0}

    def on_sample(worker: str, ts: float, sample: EngineSample) -> None:
        counts[worker] += 1

    async def scenario() -> None:
        poller = MetricsPoller(
            [Target("fast", server.url), Target("slow", slow.url)],
            interval_s=0.05,
            timeout_s=1.0,
            staleness_s=5.0,
            on_sample=on_sample,
        )
        async with poller:
            await asyncio.sleep(0.6)
        assert counts["slow"] == 0
        assert counts["fast"] >= 6  # about 12 ticks in 0.6 s; a shared tick would give 1

    try:
        asyncio.run(scenario())
    finally:
        slow.stop()


def test_stale_before_any_sample_and_on_sample_errors_are_contained() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def scenario() -> None:
        poller = MetricsPoller([Target("w0", dead)], interval_s=0.05, staleness_s=0.3)
        assert poller.stale("w0")  # never started: nothing known
        await poller.start()
        try:
            started = time.time()
            assert not poller.stale("w0", now=started + 0.1)  # grace period after start
            assert poller.stale("w0", now=started + 1.0)
            await wait_until(lambda: poller.failures["w0"] >= 2)
            status = poller.status()["w0"]
            assert status["sample"] is None and status["age_s"] is None
        finally:
            await poller.stop()

    asyncio.run(scenario())


def test_on_sample_exception_does_not_stop_polling(server: MetricsServer) -> None:
    calls: list[str] = []

    def broken(worker: str, ts: float, sample: EngineSample) -> None:
        calls.append(worker)
        raise RuntimeError("consumer bug")

    async def scenario() -> None:
        async with MetricsPoller(
            [Target("w0", server.url)], interval_s=0.05, on_sample=broken
        ) as poller:
            await wait_until(lambda: len(calls) >= 3)
            assert poller.failures == {"w0": 0}

    asyncio.run(scenario())


def test_poll_once_with_a_given_client(server: MetricsServer) -> None:
    import httpx

    async def scenario() -> None:
        async with httpx.AsyncClient() as client:
            poller = MetricsPoller([Target("w0", server.url)], client=client)
            await poller.poll_once()
            latest = poller.latest("w0")
            assert latest is not None and latest[1].waiting == 2.0
            await poller.start()
            await poller.stop()
            assert not client.is_closed  # the caller's client stays the caller's

    asyncio.run(scenario())
