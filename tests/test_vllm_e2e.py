"""The real-vLLM world end to end (issue 21's acceptance): a DP=2 vLLM server (workers
"0", "1") and a DP=1 server (worker "2", killed mid-run), the incumbent router, `shadow
tap` and the plugin, a real service ingesting and scraping. One module-scoped world runs
the load once; each test checks one property of what it left.

Byte identity: a recording proxy sits between the tap and each engine and keeps the raw
bytes the engine answered, by X-Request-Id; the client's bytes (after tap and router)
must have the same SHA-256. This compares the very bytes of one response, so it needs
no pinned `created` or deterministic sampling (two runs of a request would differ in
both).

Needs vLLM: `SHADOW_VLLM_PYTHON` (default: this interpreter if it imports vllm); with
`SHADOW_REQUIRE_VLLM=1` (CI) a missing vLLM fails instead of skipping. Run it under
`flock /tmp/vllm.lock`; `-s` prints the measured numbers.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
import pytest
import uvicorn

from shadow.connectors.tap.proxy import KEEPALIVE_EXPIRY_S
from shadow.world.emulator import QuietServer
from shadow.world.process import ServerProcess, free_port
from shadow.world.real_vllm import RealWorld, RealWorldOptions, ServerSpec
from tests.vllm_helpers import engine_value, need_vllm, scrape

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
MAX_MODEL_LEN = 16384  # the tiny model's whole context
REJECTED_PROMPT = 17000  # over --max-model-len: the engine refuses it
#: the cancelled request: long enough that the client's leaving reaches the engine well
#: before its end, though its first events may come seconds late (1,500 tokens were all
#: generated before the client had read 6 events; in a CI run 7,000 were, the stream
#: held back whole)
CANCELLED_TOKENS = 16000
#: long enough to be running on every worker at the kill. The model below decodes a
#: request in a few ms a token, and a busy API server can hold a stream back and send it
#: in one burst: with 1,500 tokens, worker 0's first long request reached its client
#: 0.5 s before its end, and ended before worker 2's first byte came (2.7 s later)
LONG_TOKENS = 4000
#: The model's shape and threads: the tiny default, OMP_NUM_THREADS left to vLLM (one
#: torch thread per process while serving). Heavier shapes, the in-process executor
#: and lower-priority engines were each tried against this build's head-of-line
#: blocking (a request reaching a busy API server starts when the stream before it ends;
#: /metrics and /health answer as late) and did not remove it; the test's phases rely
#: on what the clients see, not on the engines' timing.
MODEL_HIDDEN, MODEL_LAYERS = 128, 2
ENGINE_OMP_THREADS = None
#: tokens per streamed chunk (`--stream-interval`): the API server builds and sends a
#: chunk per STREAM_INTERVAL tokens, as real deployments batch them, and the tap's
#: multi-token chunks are counted by the engine's own numbers
STREAM_INTERVAL = 4


# -- the loop the router and the recorders run in ----------------------------------------


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Recorder:
    """A transparent proxy in front of one engine that keeps each response's raw bytes
    by the request's X-Request-Id."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.bodies: dict[str, bytes] = {}
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        self.client = self.client or httpx.AsyncClient(
            timeout=None, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)
        )
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k.decode() not in HOP]
        rid = dict(headers).get("x-request-id", "")
        path = scope["path"] + (
            f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        )
        request = self.client.build_request(
            scope["method"], self.upstream + path, headers=headers, content=body
        )
        try:
            answer = await self.client.send(request, stream=True)
        except httpx.HTTPError:
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        out = [(k.encode(), v.encode()) for k, v in answer.headers.items() if k not in HOP]
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        kept = bytearray()

        async def pump() -> None:
            async for chunk in answer.aiter_raw():
                kept.extend(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async def gone() -> None:  # the tap left: leave the engine too, as the tap would
            while (await receive())["type"] != "http.disconnect":
                pass

        tasks = [asyncio.create_task(pump()), asyncio.create_task(gone())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await answer.aclose()
            if rid:
                self.bodies[rid] = bytes(kept)


class GcPauses:
    """This process's garbage collections while the load runs. A full collection stops
    every thread here, the loop of the router and the recorders included, and late in a
    whole-suite run (one pytest process) it walks all that the earlier tests left: a
    stall of this process, not of the host, which the router's connect timer and the
    service calls' timings would show alike."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._started: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))
            self._started = None

    def summary(self) -> str:
        if not self.pauses:
            return "no collections"
        generation, worst = max(self.pauses, key=lambda p: p[1])
        full = sum(1 for g, _ in self.pauses if g == 2)
        return (f"{len(self.pauses)} collections ({full} full), the longest "
                f"{worst * 1000:.1f} ms (generation {generation})")  # fmt: skip


async def serve(app) -> tuple[QuietServer, asyncio.Task[None], str]:
    port = free_port()
    server = QuietServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}"


async def stop_served(served: list[tuple[QuietServer, asyncio.Task[None]]]) -> None:
    """Stop servers started by `serve`: left running, their tasks were destroyed pending
    when the loop closed, two warnings at the end of every CI log."""
    if not served:
        return
    for server, _ in served:
        server.should_exit = True
    _, pending = await asyncio.wait([task for _, task in served], timeout=10)
    for server, _ in served:
        server.force_exit = True  # a connection still open after 10 s is not waited for
    await asyncio.gather(*pending)


# -- the load ----------------------------------------------------------------------------


@dataclass
class Job:
    rid: str
    chat: bool
    stream: bool
    n: int
    prompt_tokens: int
    max_tokens: int
    cancel_after: int | None = None  # close the connection after this many chunks
    #: or when nothing has come for this long (this vLLM build may hold a whole stream
    #: back: in one CI run the cancelled request's first byte came with its last)
    leave_after_s: float | None = None
    status: int | None = None
    body: bytes = b""
    complete: bool = False
    chunks: int = 0
    error: str | None = None
    left_at: float | None = None  # when the client closed the connection mid-stream
    sent_at: float | None = None
    done_at: float | None = None
    first_byte_at: float | None = None

    @property
    def ids(self) -> list[str]:
        base = f"chatcmpl-{self.rid}" if self.chat else f"cmpl-{self.rid}-0"
        return [base] if self.n == 1 else [f"{base}#{i}" for i in range(self.n)]

    def payload(self) -> dict:
        body: dict = {"model": "tiny", "max_tokens": self.max_tokens, "ignore_eos": True}
        if self.chat:
            # the tiny tokenizer has no merge for " route": about one token per word
            body["messages"] = [{"role": "user", "content": "route " * self.prompt_tokens}]
        else:
            body["prompt"] = [5 + i % 200 for i in range(self.prompt_tokens)]
        body |= {"stream": self.stream, "n": self.n}
        return body


def call(router: str, job: Job) -> Job:
    path = "/v1/chat/completions" if job.chat else "/v1/completions"
    headers = {"x-request-id": job.rid, "accept-encoding": "identity"}
    job.sent_at = time.time()
    timeout = httpx.Timeout(300.0, read=job.leave_after_s or 300.0)
    try:
        with (
            httpx.Client(timeout=timeout) as client,
            client.stream("POST", router + path, json=job.payload(), headers=headers) as answer,
        ):
            job.status = answer.status_code
            data = bytearray()
            tail = b""  # the last bytes before this chunk: an event's "data: " may straddle
            for chunk in answer.iter_raw():
                job.first_byte_at = job.first_byte_at or time.time()
                data += chunk
                # counted in what came, not in the whole body again: that was quadratic,
                # and 7,000-token streams held the GIL for seconds, starving the router
                # and the recorders in this process
                seen = tail + chunk
                job.chunks += seen.count(b"data: ")
                tail = seen[-5:]
                if job.cancel_after is not None and job.chunks >= job.cancel_after:
                    job.left_at = time.time()
                    break  # leaving the block closes the connection mid-stream
            else:
                job.complete = True
            job.body = bytes(data)
            job.done_at = time.time()
    except httpx.ReadTimeout:
        if job.leave_after_s is None:
            job.error = "ReadTimeout"
        else:  # the client gives up waiting and leaves: the connection closes here
            job.left_at = job.done_at = time.time()
    except httpx.HTTPError as error:
        job.error = f"{type(error).__name__}: {error}"
    return job


def timeline(jobs: list[Job], t0: float) -> list[tuple]:
    """Each job's first byte and end, in seconds since `t0` (None: not reached)."""
    return [
        tuple(None if at is None else round(at - t0, 2) for at in (j.first_byte_at, j.done_at))
        for j in jobs
    ]


def jobs() -> list[Job]:
    """Several dozen of known length: chat and completions, streaming and not, some n = 2,
    prompts of 50-2,000 tokens."""
    out = []
    for i in range(42):
        out.append(
            Job(
                rid=f"e2e{i}-{uuid.uuid4().hex[:8]}",
                chat=i % 3 == 1,
                stream=i % 4 != 3,
                n=2 if i % 7 == 5 else 1,
                prompt_tokens=50 + (i * 331) % 1951,
                max_tokens=16 + (i * 37) % 140,
            )
        )
    return out


# -- the demo setting (before the module's world: never two worlds at once) ---------------


def test_demo_world_is_a_checked_setting(tmp_path):
    from shadow.service.settings import load_settings

    assert load_settings(None).demo_world == "emulator"
    config = tmp_path / "s.toml"
    config.write_text('demo_world = "vllm"\n')
    assert load_settings(config).demo_world == "vllm"
    with pytest.raises(ValueError, match="demo_world"):
        load_settings(None, demo_world="sglang")


def test_the_vllm_demo_without_vllm_is_a_clear_error(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from shadow.cli import app

    monkeypatch.setenv("SHADOW_VLLM_PYTHON", "/bin/false")
    result = CliRunner().invoke(
        app, ["serve", "--db", str(tmp_path / "d.duckdb"), "--demo", "--demo-world", "vllm"]
    )
    assert result.exit_code == 2, result.output
    assert "no vLLM importable" in result.output and "SHADOW_VLLM_PYTHON" in result.output


def test_the_vllm_demo_starts_and_its_fleet_shows_the_workers(tmp_path):
    need_vllm()
    config = tmp_path / "demo.toml"
    config.write_text('demo_world = "vllm"\ndemo_batch = 8\n')
    service = ServerProcess(tmp_path / "demo.duckdb", config, demo=True)
    try:
        service.start(timeout=600)
        with httpx.Client(base_url=service.url, timeout=30) as api:
            demo = api.get("/v1/demo").json()
            assert sorted(demo["workers"]) == ["0", "1"], demo

            def live():
                api.post("/v1/flush")
                snap = api.get("/v1/fleets/default/snapshot").json()["workers"]
                engines = api.get("/v1/fleets/default/telemetry").json()["engines"]
                workers = {w["worker"]: w for w in snap}
                fresh = all(not engines.get(w, {"stale": True})["stale"] for w in ("0", "1"))
                busy = sum(w["steps"] for w in workers.values())
                return (workers, engines) if set(workers) >= {"0", "1"} and fresh and busy else None

            found = wait_until(live, 120)
            assert found, "the demo's fleet never showed both real workers stepping"
            workers, engines = found
            print(f"\ndemo fleet: {workers}\nengines: {engines}")
            assert {workers[w]["state"] for w in ("0", "1")} == {"up"}, workers
            page = api.get("/").text
            assert "<html" in page.lower()
    finally:
        service.stop()


def engines_idle(url: str) -> bool:
    page = scrape(url)
    return all(engine_value(page, "vllm:num_requests_running", e) == 0 for e in ("0", "1"))


def generated_total(url: str) -> int:
    page = scrape(url)
    return int(sum(engine_value(page, "vllm:generation_tokens_total", e) for e in ("0", "1")))


@dataclass
class Run:
    world: RealWorld
    service: ServerProcess
    recorders: list[Recorder]
    jobs: list[Job]
    cancelled: Job
    rejected: Job
    killed_workers: list[str]
    steady: list[tuple[str, int, float]] = field(default_factory=list)
    notes: dict = field(default_factory=dict)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.service.url, timeout=30)


def wait_until(check, timeout: float = 60.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    python = need_vllm()
    tmp = tmp_path_factory.mktemp("vllm-e2e")
    loop = LoopThread()
    port = free_port()  # first: the plugin and the tap need the service's URL
    world = RealWorld(
        f"http://127.0.0.1:{port}",
        tmp / "world",
        RealWorldOptions(
            servers=(
                ServerSpec(
                    dp=2,
                    max_model_len=MAX_MODEL_LEN,
                    stream_interval=STREAM_INTERVAL,
                    omp_threads=ENGINE_OMP_THREADS,
                ),
                ServerSpec(
                    dp=1,
                    max_model_len=MAX_MODEL_LEN,
                    stream_interval=STREAM_INTERVAL,
                    omp_threads=ENGINE_OMP_THREADS,
                ),
            ),
            capacity=16,
            plugin_env={"SHADOW_PLUGIN_MAX_QUEUE": "20000"},
            model_hidden=MODEL_HIDDEN,
            model_layers=MODEL_LAYERS,
        ),
        python=python,
    )
    lines = ["poll_interval_s = 0.25", "staleness_s = 3.0"]
    for worker, url in world.worker_urls().items():
        engine = world.engine_labels()[worker]
        lines += ["[[engines]]", f'worker = "{worker}"', f'url = "{url}"', f'engine = "{engine}"']
    lines += ["[windows]", "length_s = 10.0"]
    config = tmp / "shadow.toml"
    config.write_text("\n".join(lines) + "\n")
    service = ServerProcess(tmp / "shadow.duckdb", config, port=port).start()
    recorders: list[Recorder] = []
    served: list[tuple[QuietServer, asyncio.Task[None]]] = []
    pauses, gc_note = GcPauses(), "not reached"
    try:
        upstreams = {}
        for server in world.servers:
            recorder = Recorder(server.url)
            recorders.append(recorder)
            recorder_server, task, upstreams[server.url] = loop.run(serve(recorder))
            served.append((recorder_server, task))
        world.start(upstreams=upstreams)
        addresses = loop.run(world.serve_router())
        # What the earlier tests of a whole-suite run left is collected once here and
        # frozen, so no collection during the load walks it again (`GcPauses`).
        held = len(gc.get_objects())
        started = time.perf_counter()
        gc.collect()
        gc_note = (f"before the load: a full collection of {held:,} objects took "
                   f"{(time.perf_counter() - started) * 1000:.1f} ms, then frozen")  # fmt: skip
        gc.freeze()
        gc.callbacks.append(pauses)
        yield drive(world, service, recorders, addresses.router)
    finally:
        if pauses in gc.callbacks:
            gc.callbacks.remove(pauses)
            gc.unfreeze()
            gc_note += f"; during it: {pauses.summary()}"
        print(f"--- this process's garbage collector: {gc_note}")
        (tmp / "gc.txt").write_text(gc_note + "\n")
        for server in world.servers:
            print(f"--- {server.log_path.name} (tail)\n{server.log_tail(1500)}")
        world.stop_processes()
        loop.run(world.stop_router())
        loop.run(stop_served(served))
        loop.close()
        service.stop()


#: rounds of long requests tried before the fixture gives up (see `start_longs`)
LONG_ATTEMPTS = 3


def start_longs(pool, api: httpx.Client, router: str, result: Run):
    """Five long requests, and a wait until worker 2's streams (its client has its first
    byte) with every one placed and none ended: the kill then breaks a running stream,
    and the steady phase follows at once on the others. Five, so that JSQ (fewest in
    flight, ties to the lowest index) gives workers 0 and 1 two each and worker 2, the
    one killed, one. Streaming is what the clients see: this vLLM build on 2 cores starts
    a request that reaches a busy API server only when the stream before it ends (its
    /metrics and /health answer as late), so the engines are not asked.

    Returns (the requests' futures, job id -> worker), the placement None when a long one
    ended first; the round's jobs are in `result.jobs` either way (they ran)."""
    longs = [
        Job(f"long{i}-{uuid.uuid4().hex[:8]}", False, True, 1, 200, LONG_TOKENS) for i in range(5)
    ]
    result.jobs += longs
    t0 = time.time()
    running = [pool.submit(call, router, job) for job in longs]
    placed: dict[str, str] = {}  # long job id -> the worker the tap dispatched it to
    history: list[tuple] = []  # (s since the start, placed, streaming, ended)
    began = flushed = time.monotonic()

    def look() -> str | None:
        """Whether worker 2's streams ("go") or a long one ended first ("late")."""
        nonlocal flushed
        if len(placed) < len(longs):
            if time.monotonic() - flushed >= 1.0:  # a flush a second, not one a look
                api.post("/v1/flush")
                flushed = time.monotonic()
            for job in longs:
                if job.rid not in placed:
                    worker = dispatched_to(api, job.ids[0])
                    if worker is not None:
                        placed[job.rid] = worker
        on2 = [j for j in longs if placed.get(j.rid) == "2"]
        streaming = [j.rid for j in longs if j.first_byte_at is not None and j.done_at is None]
        ended = [j.rid for j in longs if j.done_at is not None]
        now = (dict(placed), streaming, ended)
        if not history or history[-1][1:] != now:
            history.append((round(time.monotonic() - began, 2), *now))
        # every long one placed too: the split is checked right after, and the last
        # dispatch can reach the service after worker 2's stream began
        everyone = len(placed) == len(longs)
        if ended:
            return "late"
        go = everyone and bool(on2) and all(j.rid in streaming for j in on2)
        return "go" if go else None

    seen = wait_until(look, 120, every=0.1)
    answered = all(j.status == 200 and j.error is None for j in longs if j.done_at)
    if seen == "late" and answered:  # a refused or failed one is not a matter of time
        print(f"\na long request ended before worker 2's streamed; over time: {history}")
        return running, None
    assert seen == "go", (
        f"worker 2's long request never streamed before a long one ended: "
        f"clients: {[(j.rid, j.status, j.error) for j in longs if j.status or j.error]}; "
        f"refused: {[j.body[:300] for j in longs if j.status and j.status != 200]}; "
        f"over time (s, placed, streaming, ended): {history}; clients' first byte and "
        f"end (s): {timeline(longs, t0)}"
    )
    assert sorted(placed.values()) == ["0", "0", "1", "1", "2"], placed
    return running, placed


def drive(world: RealWorld, service: ServerProcess, recorders, router: str) -> Run:
    """The load: the jobs with a kill of server 1 while some run on it, a steady-phase
    comparison of the mirror with the engine, a client that leaves, a refused request."""
    load = jobs()
    cancelled = Job(
        f"gone-{uuid.uuid4().hex[:8]}", False, True, 1, 120, CANCELLED_TOKENS, cancel_after=6,
        leave_after_s=2.0,
    )  # fmt: skip
    rejected = Job(f"refused-{uuid.uuid4().hex[:8]}", False, False, 1, REJECTED_PROMPT, 16)
    result = Run(world, service, recorders, list(load), cancelled, rejected, [])
    engine_url = world.servers[0].url
    # a flush waited on the ingest behind vLLM for over 30 s once in CI (2 cores, loaded)
    api = httpx.Client(base_url=service.url, timeout=120)
    with ThreadPoolExecutor(16) as pool, api:
        for attempt in range(1, LONG_ATTEMPTS + 1):
            running, placed = start_longs(pool, api, router, result)
            if placed is not None:
                break
            # A long request ended before worker 2's streamed (a busy API server on a
            # loaded machine sent it late): this round finishes as ordinary requests,
            # and the next starts on idle engines, where JSQ places it the same way.
            for future in running:
                future.result()
            assert attempt < LONG_ATTEMPTS, "worker 2's long request never streamed in time"
            assert wait_until(lambda: engines_idle(engine_url), 120), "engines not idle"
        result.killed_workers = world.kill_server(1)
        # vLLM's running gauge is set by its stat logger after an engine iteration, so a
        # page scraped at once can still read 0 for requests already streaming (seen in a
        # fresh-clone run: 0 then 2 half a second later): compare once the page has them
        labels = world.engine_labels()
        wait_until(
            lambda: all(
                engine_value(scrape(engine_url), "vllm:num_requests_running", labels[w]) > 0
                for w in ("0", "1")
            ),
            10,
        )
        for _ in range(6):
            api.post("/v1/flush")
            workers = {
                w["worker"]: w for w in api.get("/v1/fleets/default/snapshot").json()["workers"]
            }
            page = scrape(engine_url)
            for worker in ("0", "1"):
                engine = world.engine_labels()[worker]
                real = engine_value(page, "vllm:num_requests_running", engine)
                result.steady.append((worker, workers[worker]["active"], real))
            time.sleep(0.5)
        for future in running:
            future.result()
        load_futures = [pool.submit(call, router, job) for job in load]
        for future in load_futures:
            future.result()
        # after the load, when the router has seen worker 2 fail and excluded it: sent
        # with the load, it raced the first request to reach the dead worker and could
        # be the one answered 502 instead of the engine's 400
        call(router, rejected)
    # the client that leaves, alone on idle engines: the engine's own count of what it
    # generated for it is the move of vllm:generation_tokens_total (vLLM 0.32 reports no
    # FinishedRequestStats for an abort, so the plugin cannot say it)
    idle = wait_until(lambda: engines_idle(engine_url), 60)
    assert idle, "the engines did not go idle after the load"
    before = generated_total(engine_url)
    call(router, cancelled)
    wait_until(lambda: engines_idle(engine_url), 60)
    time.sleep(1.0)
    result.notes["cancelled_engine_tokens"] = generated_total(engine_url) - before
    return result


# -- the checks ----------------------------------------------------------------------------


def history_path(request_id: str) -> str:
    """The id as a path segment: an n > 1 child's `#` unquoted starts the URL's fragment,
    which the client drops, so `<id>#<k>` would ask for the parent `<id>`."""
    return quote(request_id, safe="")


def finishes(api: httpx.Client, request_id: str) -> list[dict]:
    answer = api.get(f"/v1/fleets/default/requests/{history_path(request_id)}")
    if answer.status_code == 404:
        return []
    return [e for e in answer.json()["events"] if e["type"] == "finish"]


def dispatched_to(api: httpx.Client, request_id: str) -> str | None:
    """The worker the request's (first) stored dispatch named; None: no dispatch."""
    answer = api.get(f"/v1/fleets/default/requests/{history_path(request_id)}")
    if answer.status_code == 404:
        return None
    workers = [e["worker"] for e in answer.json()["events"] if e["type"] == "dispatch"]
    return str(workers[0]) if workers else None


def settled(run: Run, api: httpx.Client) -> dict[str, str]:
    """Waits until every request the clients ended has its stored finishes: the tap's,
    and for one that ran to its end the plugin's exact count too; returns those still
    without them (id -> what the client saw). Rows are stored on arrival and joined when
    applied: the flush of the last call comes after every awaited row was seen, so it
    applies them (an earlier "any finish" wait could read an engine row with the tap's
    row arrived but not yet joined, two kept finishes)."""
    ran = {id(j) for j in ran_to_length(run)}

    def lacks(job: Job, rid: str) -> bool:
        sources = {("engine" if r["from_engine"] else "tap") for r in finishes(api, rid)}
        return "tap" not in sources or (id(job) in ran and "engine" not in sources)

    def missing() -> dict[str, str]:
        api.post("/v1/flush")
        return {
            rid: f"status {job.status}, n {job.n}, chat {job.chat}, stream {job.stream}"
            for job in run.jobs
            if job.complete
            for rid in job.ids
            if lacks(job, rid)
        }

    wait_until(lambda: not missing(), 60)
    return missing()


def ran_to_length(run: Run) -> list[Job]:
    def ran(j: Job) -> bool:
        ended = b"data: [DONE]" in j.body if j.stream else j.body.rstrip().endswith(b"}")
        return j.complete and j.status == 200 and ended and b'"error"' not in j.body

    return [j for j in run.jobs if ran(j)]


def test_every_finished_request_stores_what_the_engine_generated(run):
    with run.client() as api:
        missing = settled(run, api)
        ok = ran_to_length(run)
        assert not {r for j in ok for r in j.ids} & set(missing), f"no stored finish: {missing}"
        assert len(ok) >= 36, f"only {len(ok)} requests ran to length"
        wrong = {}
        for job in ok:
            for rid in job.ids:
                rows = finishes(api, rid)
                kept = [r["output_tokens"] for r in rows if r["joined_to"] is None]
                if kept != [job.max_tokens]:
                    wrong[rid] = (job.max_tokens, [(r["source"], r["output_tokens"],
                                  r["estimated"], r["joined_to"]) for r in rows])  # fmt: skip
        print(
            f"\n{len(ok)} requests ran to length ({sum(j.n for j in ok)} choices); wrong: {wrong}"
        )
        assert not wrong, f"stored output_tokens differ from max_tokens: {wrong}"


def test_the_cancelled_request_stores_the_engines_own_count(run):
    job = run.cancelled
    # it left after 6 events or after 2 s without any (status None: before the headers)
    assert job.left_at is not None and not job.complete and job.error is None, job
    assert job.status in (None, 200), job.status
    generated = run.notes["cancelled_engine_tokens"]
    with run.client() as api:
        [rid] = job.ids

        def stored() -> list[dict]:
            api.post("/v1/flush")
            return finishes(api, rid)

        rows = wait_until(stored, 30)
    print(f"\ncancelled after {job.chunks} chunks; the engine generated {generated}; {rows}")
    left = job.left_at or 0.0
    ends = {r["source"]: round(r["ts"] - left, 3) for r in rows}
    timing = (f"sent {left - (job.sent_at or 0):.3f} s and first byte "
              f"{left - (job.first_byte_at or 0):.3f} s before the client left")  # fmt: skip
    assert job.chunks - 2 <= generated < job.max_tokens, (
        f"{job.chunks} chunks read, {generated} generated; {timing}; finishes after the "
        f"client left by (s): {ends}"
    )
    print(timing)
    assert rows and {r["reason"] for r in rows} <= {"cancelled", "abort"}, rows
    # vLLM 0.32 reports no count for an aborted request, so the stored one is the tap's:
    # what it streamed, flagged as an estimate: at least what the client read, never more
    # than the engine generated. How much less is what the API server still held when
    # the abort reached the engine: this build on 2 cores holds a stream's output for
    # seconds (the client's 6 events took 2.9 s to come in one run), so it is printed,
    # not bounded (an earlier bound of 2 tokens held only while the API server kept up).
    [kept] = [r for r in rows if r["joined_to"] is None]
    assert kept["estimated"] is True, kept
    print(f"stored {kept['output_tokens']} (the tap's estimate), the engine generated "
          f"{generated}: {generated - kept['output_tokens']} never streamed")  # fmt: skip
    assert job.chunks - 2 <= kept["output_tokens"] <= generated, (kept, generated, job.chunks)


def test_progress_never_exceeds_the_final_count(run):
    with run.client() as api:
        settled(run, api)
        over = {}
        for job in ran_to_length(run):
            for rid in job.ids:
                path = f"/v1/fleets/default/requests/{history_path(rid)}"
                progress = api.get(path).json()["progress"]
                if progress is not None and progress["generated"] > job.max_tokens:
                    over[rid] = (progress["generated"], job.max_tokens)
        assert not over, f"progress above the final count: {over}"


def test_the_clients_bytes_are_the_engines_bytes(run):
    recorded = {rid: body for r in run.recorders for rid, body in r.bodies.items()}
    compared, differ = 0, []
    for job in ran_to_length(run):
        engine = recorded.get(job.rid)
        assert engine is not None, f"{job.rid} never reached an engine"
        compared += 1
        if hashlib.sha256(engine).digest() != hashlib.sha256(job.body).digest():
            differ.append(job.rid)
    print(f"\nSHA-256 identical for {compared - len(differ)} of {compared} responses")
    assert compared >= 36 and not differ, f"bytes differ through the tap: {differ}"


def test_the_mirror_counts_what_the_engine_runs(run):
    diffs = [abs(mirror - real) for _, mirror, real in run.steady]
    print(f"\nsteady phase (worker, mirror active, vllm running): {run.steady}")
    assert run.steady and max(r for *_, r in run.steady) > 0, "no steady load was seen"
    assert max(diffs) <= 1, f"mirror and engine apart during the load: {run.steady}"
    with run.client() as api:

        def equal():
            api.post("/v1/flush")
            snap = api.get("/v1/fleets/default/snapshot").json()["workers"]
            active = {w["worker"]: w["active"] for w in snap}
            page = scrape(run.world.servers[0].url)
            real = {w: engine_value(page, "vllm:num_requests_running", w) for w in ("0", "1")}
            pairs = {w: (active.get(w), real[w]) for w in ("0", "1")}
            return pairs if all(a == r for a, r in pairs.values()) else None

        pairs = wait_until(equal, 30)
        print(f"after the load (worker: mirror, vllm): {pairs}")
        assert pairs, "after the load the mirror's active count is not the engine's"


def test_engine_steps_match_the_engines_iteration_count(run):
    with run.client() as api:
        settled(run, api)
        time.sleep(2.0)  # the plugin's last steps
        api.post("/v1/flush")
        steps = {
            w["worker"]: w["steps"]
            for w in api.get("/v1/fleets/default/snapshot").json()["workers"]
        }
    page = scrape(run.world.servers[0].url)
    for worker in ("0", "1"):
        real = engine_value(page, "vllm:iteration_tokens_total_count", worker)
        print(f"\nworker {worker}: {steps[worker]} engine_step rows, vLLM {real:.0f} iterations")
        assert real > 100, f"too few iterations to compare: {real}"
        assert abs(steps[worker] - real) <= 0.03 * real, (worker, steps[worker], real)


def test_the_step_model_is_fitted_from_real_steps(run):
    with run.client() as api:
        fit = wait_until(
            lambda: (f := api.get("/v1/fleets/default/stepmodel").json())["n"] and f, 60
        )
    print(
        f"\nstep model from real vLLM steps: a = {fit['a_ms_per_token']:.6f} ms/token, "
        f"b = {fit['b_ms']:.3f} ms, R^2 = {fit.get('r2')}, n = {fit['n']} ({fit.get('reason')})"
    )
    assert fit["n"] >= 50 and fit["b_ms"] > 0, fit


def test_the_faults_give_exactly_the_expected_violations(run):
    with run.client() as api:
        missing = settled(run, api)
        snapshot = {
            w["worker"]: w for w in api.get("/v1/fleets/default/snapshot").json()["workers"]
        }
        violations = api.get("/v1/fleets/default/violations", params={"limit": 500}).json()["items"]
        rejected = finishes(api, run.rejected.ids[0])
        # a stream cut by the kill may still end cleanly for the client (the tap closes
        # it): broken is a 200 that did not run to its [DONE] without an error
        broken = [j for j in run.jobs if j.status == 200 and j not in ran_to_length(run)]
        reasons = {j.rid: [r["reason"] for r in finishes(api, j.ids[0])] for j in broken}
        # events applied after later ones (beyond the reorder window): a drift seen on
        # healthy workers with many of them is the stream's order, not the engines'
        snap = api.get("/v1/fleets/default/snapshot").json()
        late = (snap["late_events"], snap["late_by_source"])
        # where each request answered 502 was dispatched: the dead engine's 502 comes
        # through the tap from worker 2; one the router made itself (an HTTP error on its
        # way to the tap, a host stall) may be on any worker, with room there
        bad_gateway = [j for j in run.jobs if j.status == 502]
        answered_502 = {r: dispatched_to(api, r) for j in bad_gateway for r in j.ids}
    print(f"\nanswered 502: {[(j.rid, answered_502[j.ids[0]], j.body[:80]) for j in bad_gateway]}")
    expected = {("over_capacity", "2", r) for r, worker in answered_502.items() if worker == "2"}
    unexpected = [
        (v["kind"], v.get("worker"), v.get("request_id"), v.get("detail"))
        for v in violations
        if (v["kind"], v.get("worker"), v.get("request_id")) not in expected
    ]
    print(
        f"\nviolations: {[(v['kind'], v.get('worker'), v.get('request_id')) for v in violations]}"
        f"\nunexpected, in full: {unexpected}"
        f"\nlate events: {late}"
        f"\nthe long ones: {[(j.rid, j.status, j.complete, j.chunks) for j in run.jobs[-5:]]}"
    )
    assert not missing, f"requests without a stored finish: {missing}"
    # the refused request: an error finish of no tokens, no slot kept
    assert run.rejected.status == 400, run.rejected.status
    assert [r["reason"] for r in rejected] == ["error"] and rejected[0]["output_tokens"] == 0
    # the killed engine: down, the streams it held ended in error, their slots released
    assert run.killed_workers == ["2"]
    assert broken and all(j.rid.startswith("long") for j in broken), [j.rid for j in broken]
    assert all(r == ["error"] for r in reasons.values()), reasons
    assert snapshot["2"]["state"] == "down" and snapshot["2"]["active"] == 0, snapshot["2"]
    # the one expected violation: the incumbent router, not yet aware of the kill, sends
    # requests to the dead worker (each answered 502): dispatches to a worker with no
    # free slot; the client that left and the refused request are no violation
    got = [(v["kind"], v.get("worker"), v.get("request_id")) for v in violations]
    assert not unexpected and set(got) == expected, {
        "unexpected": unexpected,
        "expected but absent": sorted(expected - set(got)),
    }
