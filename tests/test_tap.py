"""The deployable tap (`shadow tap`) over real loopback HTTP: the emulated engines (and a
scripted upstream for the shapes they do not send) behind it, a real shadow service
ingesting its events with a bearer token.

What it must prove: the client's bytes are the upstream's bytes (SHA-256 against the
upstream's own record), the events say what happened (ids, worker, tokens, reason), a
failure or a cancellation is a finish and never a worker down, and a dead service costs
the stream nothing but dropped (and counted) events.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from shadow.connectors.tap.config import (
    TapConfig,
    TapConfigError,
    config_from_mapping,
    engine_from_mapping,
    parse_engine_option,
    validate,
)
from shadow.connectors.tap.serve import RunningTap
from shadow.world.emulator import EmulatedFleet
from shadow.world.process import REPO, ServerProcess, free_port
from tests.service_helpers import ThreadedServer
from tests.vllm_helpers import need_vllm

TOKEN = "tap-test-ingest-token-0123456789"


class LoopThread:
    """An event loop in a daemon thread: the emulated fleet and the tap run there while
    the test talks to them with blocking clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


# --------------------------------------------------------------------------- a scripted upstream


def _chunk(rid: str, index: int, text: str, finish: str | None = None) -> bytes:
    choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish,
              "stop_reason": None}  # fmt: skip
    body = {"id": rid, "object": "text_completion", "created": 1, "model": "m",
            "choices": [choice]}  # fmt: skip
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class ScriptedUpstream:
    """Shapes the emulator does not send yet: `x-case: n2` (two choices interleaved),
    `error` (an error object mid-stream, then [DONE]), `break` (two chunks, then the
    connection dies), `hang` (two chunks, then nothing
    until the client leaves). `sent[request id]` is the SHA-256 of what it wrote, and
    `closed` the ids whose client went away."""

    def __init__(self) -> None:
        self.sent: dict[str, str] = {}
        self.closed: set[str] = set()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        case = headers.get(b"x-case", b"").decode()
        rid = headers.get(b"x-request-id", b"none").decode()
        while (await receive()).get("more_body"):
            pass
        digest = hashlib.sha256()

        async def write(data: bytes, more: bool = True) -> None:
            digest.update(data)
            await send({"type": "http.response.body", "body": data, "more_body": more})

        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        cid = f"cmpl-{rid}"
        if case == "n2":
            for i in range(3):
                last = "length" if i == 2 else None
                await write(_chunk(cid, 0, f" a{i}", last) + _chunk(cid, 1, f" b{i}", last))
            await write(b"data: [DONE]\n\n", more=False)
        elif case == "error":
            await write(_chunk(cid, 0, " x") + _chunk(cid, 0, ""))
            await write(b'data: {"error":{"message":"engine died","code":500}}\n\n')
            await write(b"data: [DONE]\n\n", more=False)
        elif case == "break":  # two chunks, then the connection dies mid-body
            await write(_chunk(cid, 0, " x"))
            await write(_chunk(cid, 0, " y"))
            self.sent[rid] = digest.hexdigest()
            raise ConnectionAbortedError("the engine died mid-answer")
        elif case == "hang":
            await write(_chunk(cid, 0, " x"))
            await write(_chunk(cid, 0, " y"))
            while (await receive())["type"] != "http.disconnect":
                pass
            self.closed.add(rid)
        self.sent[rid] = digest.hexdigest()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tapservice")
    import os

    os.environ["SHADOW_TOKENS_INGEST"] = TOKEN
    try:
        server = ServerProcess(tmp / "tap.duckdb").start()
    finally:
        del os.environ["SHADOW_TOKENS_INGEST"]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def world(service, tmp_path_factory):
    """Two emulated engines and a scripted one, behind one tap that reaches them all
    three ways: w0 on its own listener, w1 by path prefix, w2 (scripted) by header."""
    tmp = tmp_path_factory.mktemp("tap")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    loop = LoopThread()
    fleet = EmulatedFleet(2, 8)
    loop.run(fleet.start())
    scripted = ScriptedUpstream()
    upstream = ThreadedServer(scripted).start()
    config = validate(config_from_mapping({"tap": {
        "service": service.url, "token_file": str(token_file), "listen": "127.0.0.1:0",
        "progress_interval_s": 0.05, "engines": [
            {"worker": "w0", "upstream": fleet.worker_urls[0], "listen": "127.0.0.1:0",
             "capacity": 8, "dp_rank": 0},
            {"worker": "w1", "upstream": fleet.worker_urls[1], "path_prefix": "/w1",
             "capacity": 8},
            {"worker": "w2", "upstream": upstream.url, "header": "w2", "capacity": 8},
        ],
    }}))  # fmt: skip
    tap = loop.run(RunningTap(config).start())
    yield loop, fleet, scripted, tap, service
    loop.run(tap.stop())
    loop.run(fleet.stop())
    upstream.stop()
    loop.close()


def _routes(tap: RunningTap) -> dict[str, tuple[str, dict[str, str]]]:
    """worker -> (base URL, extra headers) to reach it through the tap."""
    shared = tap.addresses["shared"]
    return {
        "w0": (tap.addresses["w0"], {}),
        "w1": (shared + "/w1", {}),
        "w2": (shared, {"x-shadow-worker": "w2"}),
    }


def _stream(url: str, body: dict, headers: dict[str, str]) -> tuple[int, bytes, httpx.Headers]:
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, json=body, headers=headers) as response,
    ):
        data = b"".join(response.iter_raw())
        return response.status_code, data, response.headers


def _history(service: ServerProcess, request_id: str, kinds: int = 3) -> list[dict]:
    """The request's stored events once `kinds` of them are in (ready, dispatch, finish)."""
    with httpx.Client(base_url=service.url, timeout=30,
                      headers={"authorization": f"Bearer {TOKEN}"}) as client:  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            client.post("/v1/flush")
            path = f"/v1/fleets/default/requests/{quote(request_id, safe='')}"
            events = client.get(path).json().get("events", [])
            if sum(e["type"] == "finish" for e in events) and len(events) >= kinds:
                return events
            assert time.monotonic() < deadline, f"no finish for {request_id}: {events}"
            time.sleep(0.2)


def _finish(events: list[dict]) -> dict:
    finishes = [e for e in events if e["type"] == "finish"]
    assert len(finishes) == 1, finishes
    return finishes[0]


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("worker", ["w0", "w1"])
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [True, False])
def test_bytes_are_the_engines_and_the_events_say_what_happened(world, worker, chat, stream):
    _, fleet, _, tap, service = world
    base, extra = _routes(tap)[worker]
    header_id = uuid.uuid4().hex
    body: dict = {"model": "emulated-model", "max_tokens": 12, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": "one two three four"}]
        path, request_id = "/v1/chat/completions", f"chatcmpl-{header_id}"
    else:
        body["prompt"] = "one two three four"
        path, request_id = "/v1/completions", f"cmpl-{header_id}-0"
    status, data, _ = _stream(base + path, body, {"x-request-id": header_id, **extra})
    assert status == 200
    assert hashlib.sha256(data).hexdigest() == _sent_digest(fleet, header_id)
    events = _history(service, request_id)
    kinds = [e["type"] for e in events]
    assert kinds.count("ready") == kinds.count("dispatch") == 1
    dispatch = next(e for e in events if e["type"] == "dispatch")
    assert dispatch["worker"] == worker
    finish = _finish(events)
    assert finish["reason"] == "length" and finish["output_tokens"] == 12
    progress = [e["generated"] for e in events if e["type"] == "progress"]
    assert progress == sorted(progress) and all(p <= 12 for p in progress)


def test_the_tap_names_a_request_the_client_did_not_and_the_engine_sees_that_id(world):
    _, fleet, _, tap, service = world
    base, _ = _routes(tap)["w0"]
    body = {"model": "m", "prompt": "a b", "max_tokens": 3, "stream": True}
    status, data, headers = _stream(base + "/v1/completions", body, {})
    header_id = headers["x-request-id"]  # the emulator echoes the id it was sent
    assert status == 200 and re.fullmatch(r"[0-9a-f]{32}", header_id)
    assert hashlib.sha256(data).hexdigest() == _sent_digest(fleet, header_id)
    assert _finish(_history(service, f"cmpl-{header_id}-0"))["output_tokens"] == 3


def test_n_2_is_two_requests_in_the_shadow(world):
    _, _, scripted, tap, service = world
    base, extra = _routes(tap)["w2"]
    body = {"model": "m", "prompt": "p", "max_tokens": 3, "n": 2, "stream": True}
    header_id = uuid.uuid4().hex
    status, data, _ = _stream(base + "/v1/completions", body,
                              {"x-request-id": header_id, "x-case": "n2", **extra})  # fmt: skip
    assert status == 200 and hashlib.sha256(data).hexdigest() == scripted.sent[header_id]
    for child in ("#0", "#1"):
        events = _history(service, f"cmpl-{header_id}-0{child}")
        assert next(e for e in events if e["type"] == "dispatch")["worker"] == "w2"
        finish = _finish(events)
        assert finish["reason"] == "length" and finish["output_tokens"] == 3


def test_an_error_object_mid_stream_ends_the_request_in_error(world):
    _, _, scripted, tap, service = world
    base, extra = _routes(tap)["w2"]
    header_id = uuid.uuid4().hex
    body = {"model": "m", "prompt": "p", "max_tokens": 9, "stream": True}
    _, data, _ = _stream(base + "/v1/completions", body,
                         {"x-request-id": header_id, "x-case": "error", **extra})  # fmt: skip
    assert hashlib.sha256(data).hexdigest() == scripted.sent[header_id]
    finish = _finish(_history(service, f"cmpl-{header_id}-0"))
    assert finish["reason"] == "error" and finish["output_tokens"] == 2


def test_an_answer_that_breaks_off_cuts_the_client_and_ends_in_error(world):
    """The tap must not end a truncated answer as a whole one: the client's connection
    is cut, so its HTTP client sees the body incomplete."""
    _, _, _, tap, service = world
    base, extra = _routes(tap)["w2"]
    header_id = uuid.uuid4().hex
    body = {"model": "m", "prompt": "p", "max_tokens": 9, "stream": True}
    received = b""
    with httpx.Client(timeout=30) as client, pytest.raises(httpx.RemoteProtocolError):
        headers = {"x-request-id": header_id, "x-case": "break", **extra}
        with client.stream("POST", base + "/v1/completions", json=body, headers=headers) as r:
            for data in r.iter_raw():
                received += data
    assert received.count(b"data: ") == 2
    finish = _finish(_history(service, f"cmpl-{header_id}-0"))
    assert finish["reason"] == "error" and finish["output_tokens"] == 2


def test_a_client_that_leaves_closes_the_upstream_and_is_cancelled(world):
    _, _, scripted, tap, service = world
    base, extra = _routes(tap)["w2"]
    header_id = uuid.uuid4().hex
    body = {"model": "m", "prompt": "p", "max_tokens": 9, "stream": True}
    with httpx.Client(timeout=30) as client:
        headers = {"x-request-id": header_id, "x-case": "hang", **extra}
        with client.stream("POST", base + "/v1/completions", json=body, headers=headers) as r:
            next(r.iter_raw())
    deadline = time.monotonic() + 10
    while header_id not in scripted.closed:
        assert time.monotonic() < deadline, "the tap kept the upstream request open"
        time.sleep(0.05)
    finish = _finish(_history(service, f"cmpl-{header_id}-0"))
    assert finish["reason"] == "cancelled"


def test_an_unreachable_engine_is_an_error_finish_never_a_worker_down(world, service, tmp_path):
    loop, _, _, _, _ = world
    (tmp_path / "token").write_text(TOKEN)
    config = validate(config_from_mapping({"tap": {
        "service": service.url, "listen": "127.0.0.1:0", "source": "tap-dead-engine",
        "token_file": str(tmp_path / "token"),
        "engines": [{"worker": "w9", "upstream": f"http://127.0.0.1:{free_port()}",
                     "path_prefix": "/w9", "capacity": 4}],
    }}))  # fmt: skip
    tap = loop.run(RunningTap(config).start())
    try:
        header_id = uuid.uuid4().hex
        body = {"model": "m", "prompt": "p", "max_tokens": 4, "stream": True}
        status, _, _ = _stream(tap.addresses["shared"] + "/w9/v1/completions", body,
                               {"x-request-id": header_id})  # fmt: skip
        assert status == 502
        finish = _finish(_history(service, f"cmpl-{header_id}-0"))
        assert finish["reason"] == "error" and finish["output_tokens"] == 0
        metrics = httpx.get(tap.addresses["shared"] + "/metrics").text
        assert 'shadow_tap_upstream_errors_total{worker="w9"} 1.0' in metrics
        with httpx.Client(base_url=service.url) as client:
            workers = {w["worker"]: w for w in client.get(
                "/v1/fleets/default/snapshot").json()["workers"]}  # fmt: skip
        assert workers["w9"]["state"] == "up"
    finally:
        loop.run(tap.stop())


def test_other_paths_pass_through_without_events_and_metrics_count_every_byte(world):
    tap = world[3]
    base, _ = _routes(tap)["w1"]
    before = _metric(tap, "shadow_tap_bytes_total", 'worker="w1"')
    models = httpx.get(base + "/v1/models")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "emulated-model"
    # the engine's own headers, each once: the tap's server adds no `server` or `date`
    direct = httpx.get(world[1].worker_urls[1] + "/v1/models")
    assert sorted(models.headers.keys()) == sorted(direct.headers.keys())
    assert models.headers.get_list("date") == [models.headers["date"]]
    assert _metric(tap, "shadow_tap_requests_total", 'endpoint="other",worker="w1"') >= 1
    header_id = uuid.uuid4().hex
    body = {"model": "m", "prompt": "p q", "max_tokens": 5, "stream": True}
    _, data, _ = _stream(base + "/v1/completions", body, {"x-request-id": header_id})
    after = _metric(tap, "shadow_tap_bytes_total", 'worker="w1"')
    assert after - before == len(models.content) + len(data)
    chunks = sum(
        _metric(tap, "shadow_tap_chunks_total", f'worker="{w}"') for w in ("w0", "w1", "w2")
    )
    assert _metric(tap, "shadow_tap_added_latency_seconds_count", "") == chunks
    assert _metric(tap, "shadow_tap_events_sent_total", "") > 0


def test_the_path_goes_as_the_client_encoded_it_and_expect_stays_with_the_tap(world):
    """A space or `?` the client percent-encoded reaches the engine encoded (the engine's
    own answer, not a request line the tap broke); an `Expect: 100-continue` is the
    tap's to answer (it reads the body first), never forwarded for a second answer."""
    tap = world[3]
    engine_url = world[1].worker_urls[1]
    for path in ("/v1/models%20x", "/v1/models%3Fx=1", "/v1/%E2%82%AC"):
        direct = httpx.get(engine_url + path)
        through = httpx.get(_routes(tap)["w1"][0] + path)
        assert (through.status_code, through.content) == (direct.status_code, direct.content)
    base, extra = _routes(tap)["w1"]
    header_id = uuid.uuid4().hex
    body = {"model": "m", "prompt": "p q", "max_tokens": 3, "stream": False}
    headers = {"x-request-id": header_id, "expect": "100-continue", **extra}
    status, data, _ = _stream(base + "/v1/completions", body, headers)
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 3


def _sent_digest(fleet, key: str, timeout_s: float = 5.0) -> str:
    """The digest the emulated worker records once its response is written: the client can
    read the last byte a moment before the worker's code after it has run."""
    deadline = time.monotonic() + timeout_s
    while key not in fleet.sent_digests and time.monotonic() < deadline:
        time.sleep(0.01)
    return fleet.sent_digests[key]


def _metric(tap: RunningTap, name: str, labels: str) -> float:
    text = httpx.get(tap.addresses["shared"] + "/metrics").text
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_dead_service_costs_the_stream_nothing_and_drops_are_counted(world):
    loop, fleet, _, _, _ = world
    config = validate(config_from_mapping({"tap": {
        "service": f"http://127.0.0.1:{free_port()}", "listen": "127.0.0.1:0",
        "max_buffer": 5, "engines": [
            {"worker": "w0", "upstream": fleet.worker_urls[0], "path_prefix": "/w0"}],
    }}))  # fmt: skip
    tap = loop.run(RunningTap(config).start())
    try:
        body = {"model": "m", "prompt": "p", "max_tokens": 25, "stream": True}
        samples: dict[str, list[float]] = {"direct": [], "tap": []}
        # alternated, three of each: one stream's time also holds whatever else the host
        # ran meanwhile (a CI run beside a benchmark once put 0.26 s on a single one)
        for _ in range(3):
            for route, base in (("direct", fleet.worker_urls[0]),
                                ("tap", tap.addresses["shared"] + "/w0")):  # fmt: skip
                header_id = uuid.uuid4().hex
                started = time.perf_counter()
                _, data, _ = _stream(base + "/v1/completions", body, {"x-request-id": header_id})
                samples[route].append(time.perf_counter() - started)
                assert hashlib.sha256(data).hexdigest() == _sent_digest(fleet, header_id)
        assert tap.sink.dropped > 0
        assert _metric(tap, "shadow_tap_events_dropped_total", "") == tap.sink.dropped
        # 25 emulated steps of 20 ms: a tap that waited on the service (a connect
        # timeout, a retry) would add whole seconds to every stream, the median's too;
        # one that waited only once (the first stream after the service died) would add
        # them to the sum
        timings = {route: statistics.median(times) for route, times in samples.items()}
        assert timings["tap"] < timings["direct"] + 0.25, samples
        assert sum(samples["tap"]) < sum(samples["direct"]) + 0.5, samples
    finally:
        loop.run(tap.stop())


# --------------------------------------------------------------------------- config and CLI


def test_config_errors_name_the_field():
    cases = [
        ({"worker": "w0"}, "e.upstream: required"),
        ({"worker": "w0", "upstream": "ftp://x", "listen": "h:1"}, "e.upstream: expected"),
        ({"worker": "w0", "upstream": "http://x", "listen": "nope"}, "e.listen: expected host"),
        ({"worker": "w0", "upstream": "http://x"}, "e: set exactly one of listen"),
        ({"worker": "w0", "upstream": "http://x", "header": "a", "path_prefix": "/a"},
         "e: set exactly one"),
        ({"worker": "w0", "upstream": "http://x", "listen": "h:1", "dp_rank": -1},
         "e.dp_rank: expected an integer >= 0"),
        ({"worker": "w0", "upstream": "http://x", "listen": "h:1", "color": 1},
         "e.color: unknown key"),
    ]  # fmt: skip
    for raw, message in cases:
        with pytest.raises(TapConfigError, match=re.escape(message)):
            engine_from_mapping(raw, "e")
    with pytest.raises(TapConfigError, match=re.escape("tap.engines[1].worker: 'a' is also")):
        validate(config_from_mapping({"tap": {"service": "http://s", "listen": "h:1", "engines": [
            {"worker": "a", "upstream": "http://x", "path_prefix": "/a"},
            {"worker": "a", "upstream": "http://x", "path_prefix": "/b"}]}}))  # fmt: skip
    with pytest.raises(TapConfigError, match=re.escape("tap.engines[0].header: needs the shared")):
        validate(config_from_mapping({"tap": {"service": "http://s", "metrics_listen": "h:2",
            "engines": [{"worker": "a", "upstream": "http://x", "header": "a"}]}}))  # fmt: skip
    with pytest.raises(TapConfigError, match=re.escape("tap.service: required")):
        validate(TapConfig(listen=("h", 1), engines=(parse_engine_option(
            "worker=a,upstream=http://x,path_prefix=/a", 0),)))  # fmt: skip
    engine = parse_engine_option(
        "worker=w0,upstream=http://e:8000/,listen=0.0.0.0:9001,dp_rank=1", 0
    )
    assert (engine.upstream, engine.listen, engine.dp_rank) == (
        "http://e:8000",
        ("0.0.0.0", 9001),
        1,
    )


def test_the_command_refuses_a_bad_config_naming_the_field(tmp_path):
    config = tmp_path / "tap.toml"
    config.write_text('[tap]\nservice = "http://s"\nlisten = "127.0.0.1:0"\n'
                      '[[tap.engines]]\nworker = "w0"\nupstream = "http://e"\n'
                      'path_prefix = "/w0"\ncapacity = 0\n')  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "shadow.cli", "tap", "--config", str(config)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "tap.engines[0].capacity: expected an integer >= 1" in result.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "shadow.cli", "tap", "--service", "http://s", "--listen",
         "127.0.0.1:0", "--engine", "worker=w0,upstream=http://e,path_prefix=/w0",
         "--token-file", str(tmp_path / "absent")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "--token-file: cannot read" in missing.stderr


def test_the_help_documents_both_ways_in():
    result = subprocess.run([sys.executable, "-m", "shadow.cli", "tap", "--help"],
                            capture_output=True, text=True, cwd=REPO, timeout=60,
                            env={"COLUMNS": "120", "PATH": "/usr/bin:/bin",
                                 "PYTHONPATH": str(Path(REPO))})  # fmt: skip
    assert result.returncode == 0
    for text in ("listen=", "path_prefix=/w0", "header=w0", "X-data-parallel-rank",
                 "[[tap.engines]]"):  # fmt: skip
        assert text in result.stdout, text


# --------------------------------------------------------------------------- real vLLM


def test_real_vllm_two_ranks_through_the_tap(world, tmp_path):
    """Real vLLM (the tiny model, 2 DP ranks) behind a recorder behind the tap, whose two
    workers pin the two ranks: the client's bytes are what vLLM sent, the counts are the
    engine's, and each worker's requests ran on its rank. It starts a vLLM server: run it
    under `flock /tmp/vllm.lock` (one at a time on a shared machine)."""
    from shadow.bench.tap import Recorder, VllmServer, serve_in_thread

    loop, _, _, _, service = world
    (tmp_path / "token").write_text(TOKEN)
    engine = VllmServer(need_vllm(), tmp_path / "model", dp=2).start()
    recorder_server = tap = None
    try:
        recorder = Recorder(engine.url)
        recorder_url, recorder_server = serve_in_thread(recorder)
        config = validate(config_from_mapping({"tap": {
            "service": service.url, "token_file": str(tmp_path / "token"),
            "listen": "127.0.0.1:0", "source": "tap-vllm", "fleet": "vllm",
            "engines": [
                {"worker": "r0", "upstream": recorder_url, "path_prefix": "/r0",
                 "dp_rank": 0, "capacity": 8},
                {"worker": "r1", "upstream": recorder_url, "path_prefix": "/r1",
                 "dp_rank": 1, "capacity": 8},
            ],
        }}))  # fmt: skip
        tap = loop.run(RunningTap(config).start())
        shared = tap.addresses["shared"]
        cases = [
            ("/v1/completions", {"prompt": "hello there, engine", "stream": True}, "cmpl"),
            ("/v1/completions", {"prompt": "count me exactly", "stream": True,
                                 "stream_options": {"include_usage": True}}, "cmpl"),
            ("/v1/completions", {"prompt": "not streamed", "stream": False}, "cmpl"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                      "stream": True,
                                      "stream_options": {"include_usage": True}}, "chat"),
        ]  # fmt: skip
        ran = []
        for path, extra, kind in cases:
            header_id = uuid.uuid4().hex
            body = {"model": "tiny", "max_tokens": 24, "ignore_eos": True, **extra}
            status, data, _ = _stream(shared + "/r1" + path, body, {"x-request-id": header_id})
            assert status == 200, data[:300]
            assert hashlib.sha256(data).hexdigest() == recorder.digests[header_id]
            rid = f"chatcmpl-{header_id}" if kind == "chat" else f"cmpl-{header_id}-0"
            ran.append((rid, extra))
        with httpx.Client(base_url=service.url, headers={"authorization": f"Bearer {TOKEN}"},
                          timeout=30) as client:  # fmt: skip
            for rid, extra in ran:
                deadline = time.monotonic() + 20
                while True:
                    client.post("/v1/flush")
                    history = client.get(f"/v1/fleets/vllm/requests/{rid}").json()
                    finishes = [e for e in history.get("events", []) if e["type"] == "finish"]
                    if finishes:
                        break
                    assert time.monotonic() < deadline, f"no finish for {rid}"
                    time.sleep(0.2)
                (finish,) = finishes
                assert finish["reason"] == "length"
                exact = not extra["stream"] or "stream_options" in extra
                if exact:  # usage in the answer: the engine's own count
                    assert finish["output_tokens"] == 24
                else:  # one per chunk: a lower bound of what the engine made
                    assert 0 < finish["output_tokens"] <= 24
        page = httpx.get(engine.url + "/metrics").text
        success = {}
        for line in page.splitlines():
            if line.startswith("vllm:request_success_total{"):
                rank = re.search(r'engine="(\d+)"', line).group(1)
                success[rank] = success.get(rank, 0.0) + float(line.split()[-1])
        assert success.get("1") == len(cases) and success.get("0", 0.0) == 0, success
    finally:
        if tap is not None:
            loop.run(tap.stop())
        if recorder_server is not None:
            recorder_server.should_exit = True
        engine.stop()


def test_progress_says_whether_its_count_is_exact():
    """Each choice's progress carries the accountant's own flag: exact from continuous
    usage, an estimate from counted chunks (n > 1: usage sums the choices)."""
    from shadow.connectors.openai_stream import StreamAccountant
    from shadow.connectors.tap.proxy import TapProxy, _Request

    class Sink:
        def __init__(self) -> None:
            self.events: list[dict] = []

        def put(self, event: dict) -> None:
            self.events.append(event)

    config = config_from_mapping({"tap": {"service": "http://s", "progress_interval_s": 0.0,
        "engines": [{"worker": "w0", "upstream": "http://x", "listen": "h:1"}]}})  # fmt: skip
    sink = Sink()
    proxy = TapProxy(config, sink)  # type: ignore[arg-type]

    def chunk(text: str, usage: dict | None = None) -> bytes:
        body: dict = {"id": "cmpl-a", "object": "text_completion",
                      "choices": [{"index": 0, "text": text, "finish_reason": None}]}  # fmt: skip
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n".encode()

    exact = _Request(["cmpl-a-0"], StreamAccountant(endpoint="completions", n=1, stream=True))
    usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    proxy._apply(exact, exact.accountant.feed(chunk("x y z", usage)))
    counted = _Request(["cmpl-b-0"], StreamAccountant(endpoint="completions", n=1, stream=True))
    proxy._apply(counted, counted.accountant.feed(chunk("x") + chunk("y")))
    progress = {e["request_id"]: (e["generated"], e.get("estimated")) for e in sink.events
                if e["type"] == "progress"}  # fmt: skip
    assert progress == {"cmpl-a-0": (3, False), "cmpl-b-0": (2, True)}
