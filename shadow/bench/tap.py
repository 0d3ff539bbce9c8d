"""`shadow bench tap`: what the tap costs a real vLLM stream.

Streams are read straight and through a `shadow tap` process at the same time (so
both meet the same load on a shared machine). Between vLLM and both paths sits a recorder,
a process of its own: it relays vLLM's bytes and stamps each chunk as it writes it; the
client stamps the moment it has received every byte up to that chunk's end. Their
difference is the hop's latency per chunk, on the machine's monotonic clock; what the tap
adds is the tapped hop less the straight one (P50 and P99 of each), over the chunks whose
hop spanned no stall of the whole machine (`bench.stalls`; those are counted). The tap runs in its
own process (sending its events to a real `shadow serve`), so its CPU time per 1,000
chunks is read from the kernel and nothing else is counted in it.

Targets: P99 added <= 1 ms on loopback; <= 5% of a core at 1,000 chunks/s, i.e. at most
50 ms of tap CPU per 1,000 chunks.

vLLM runs on CPUs of its own (`split_cpus`): on this 2-core VM, sharing both cores with it
put the measuring processes in the scheduler's queue behind vLLM's compute thread, and
both paths' P99 came out at 0.2-0.7 s, in whichever order (the straight hop slower one day,
the tapped the next); pinned apart, the straight hop's P99 is a few ms. A tap in front of a
fleet does not share the engines' cores either.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from shadow.bench.stalls import Heartbeat, overlaps_stall
from shadow.connectors.tap.scheduling import current_slice_us
from shadow.connectors.tap.upstream import UpstreamClient
from shadow.world.process import REPO, ServerProcess, free_port, free_ports
from shadow.world.real_vllm import (
    TINY_MODEL_OMP_THREADS,
    engine_environment,
    require_vllm_python,
)
from shadow.world.real_vllm import VllmUnavailable as VllmUnavailable

TARGET_P99_ADDED_MS = 1.0
TARGET_CPU_S_PER_1000 = 0.05  # 5% of a core at 1,000 chunks/s
#: a straight hop whose P99 is above this says the machine's own jitter is larger than the
#: 1 ms to judge: the latency verdict is then None (inconclusive), not a pass
NOISE_P99_MS = 10.0
#: one place finds vLLM (SHADOW_VLLM_PYTHON, else this interpreter): the real-vLLM world's
vllm_python = require_vllm_python


class VllmServer:
    """The tiny model served by real vLLM on a loopback port, in a process group of its
    own (stopped whole). Start it under `flock /tmp/vllm.lock`: one at a time here."""

    def __init__(self, python: str, model_dir: Path, *, dp: int = 1, extra: tuple = ()) -> None:
        self.python = python
        self.model_dir = model_dir
        self.dp = dp
        self.extra = extra
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 240.0) -> VllmServer:
        env = engine_environment({
            **os.environ, "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", TINY_MODEL_OMP_THREADS),
        })  # fmt: skip
        # built by vLLM's Python: it has the tokenizers library, this one may not
        subprocess.run(
            [self.python, "-c", "import sys; from pathlib import Path; from shadow.world."
             "tiny_model import build_tiny_model; build_tiny_model(Path(sys.argv[1]))",
             str(self.model_dir)], env=env, check=True, timeout=300,
        )  # fmt: skip
        command = [self.python, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self.model_dir), "--served-model-name", "tiny",
                   "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16",
                   "--max-model-len", "4096", "--port", str(self.port),
                   "--data-parallel-size", str(self.dp), *self.extra]  # fmt: skip
        log = open(self.model_dir / "vllm.log", "wb")  # noqa: SIM115 - the server's lifetime
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = (self.model_dir / "vllm.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"vLLM exited ({self.process.returncode}):\n{tail}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with _suppress():
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def _suppress():
    return contextlib.suppress(ProcessLookupError)


class Recorder:
    """Relays vLLM's answers (every request header but the connection's own), stamps each
    chunk's end offset as it writes it, and keeps the SHA-256 of what it wrote, by
    X-Request-Id."""

    _DROP = frozenset({b"host", b"content-length", b"connection", b"transfer-encoding"})

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.stamps: dict[str, list[tuple[int, float]]] = {}
        self.digests: dict[str, str] = {}
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/__record":  # hand over (and forget) what was recorded
            record = json.dumps({"stamps": self.stamps, "digests": self.digests}).encode()
            self.stamps, self.digests = {}, {}
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": record})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k not in self._DROP]
        rid = dict(scope["headers"]).get(b"x-request-id", b"").decode()
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=None)
        query = scope.get("query_string", b"").decode()
        request = self.client.build_request(
            scope["method"], self.upstream + scope["path"] + (f"?{query}" if query else ""),
            content=body, headers=headers,
        )  # fmt: skip
        upstream = await self.client.send(request, stream=True)
        kept = [(k.lower(), v) for k, v in upstream.headers.raw if k.lower() not in self._DROP]
        await send({"type": "http.response.start", "status": upstream.status_code,
                    "headers": kept})  # fmt: skip
        stamps = self.stamps.setdefault(rid, [])
        digest = hashlib.sha256()
        offset = 0
        async for chunk in upstream.aiter_raw():
            offset += len(chunk)
            digest.update(chunk)
            stamps.append((offset, time.perf_counter()))
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await upstream.aclose()
        self.digests[rid] = digest.hexdigest()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def recorder_main(port: int, upstream: str) -> None:
    """The recorder as a process of its own (`bench tap` runs it so), so that neither the
    client's nor the tap's work delays its stamps."""
    uvicorn.run(Recorder(upstream), host="127.0.0.1", port=port, log_level="warning",
                lifespan="off")  # fmt: skip


def serve_in_thread(app) -> tuple[str, uvicorn.Server]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server


async def _streams(base: str, requests: int, concurrency: int, max_tokens: int, prefix: str):
    """Per request id: (received byte count, time) after every read. The client is the
    tap's own upstream client: the bench's clients read every chunk of both paths, and
    with httpx they took more CPU than anything but vLLM on a 2-core machine, loading
    the very hops they time."""
    seen: dict[str, list[tuple[int, float]]] = {}
    gate = asyncio.Semaphore(concurrency)
    client = UpstreamClient()

    async def one(i: int) -> None:
        rid = f"{prefix}-{i}-{uuid.uuid4().hex[:8]}"
        body = json.dumps({"model": "tiny", "prompt": f"request {i} says hello",
                           "stream": True, "max_tokens": max_tokens,
                           "ignore_eos": True}).encode()  # fmt: skip
        headers = [(b"content-type", b"application/json"), (b"x-request-id", rid.encode())]
        async with gate:
            marks = seen.setdefault(rid, [])
            got = 0
            response = await client.send("POST", base + "/v1/completions", headers, body)
            try:
                while data := await response.read():
                    got += len(data)
                    marks.append((got, time.perf_counter()))
            finally:
                await response.aclose()

    try:
        await asyncio.gather(*(one(i) for i in range(requests)))
    finally:
        await client.aclose()
    return seen


async def _both(direct_url: str, tap_url: str, requests: int, concurrency: int, tokens: int):
    """Straight and tapped streams at the same time, so both meet the same machine (a
    shared one's load changes from one minute to the next)."""
    return await asyncio.gather(
        _streams(direct_url, requests, concurrency, tokens, "d"),
        _streams(tap_url, requests, concurrency, tokens, "t"),
    )


def _recorded(recorder_url: str) -> tuple[dict, dict]:
    record = httpx.get(recorder_url + "/__record", timeout=30).json()
    return record["stamps"], record["digests"]


def _hops(stamps: dict, seen: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk: when the recorder wrote it and when the client had every byte of it
    (s, the machine's monotonic clock)."""
    written, received = [], []
    for rid, marks in seen.items():
        offsets = np.array([m[0] for m in marks])
        times = np.array([m[1] for m in marks])
        for end, sent in stamps.get(rid, ()):
            k = int(np.searchsorted(offsets, end))
            if k < len(times):
                written.append(sent)
                received.append(times[k])
    return np.array(written, dtype=float), np.array(received, dtype=float)


def _hop_ms(stamps: dict, seen: dict, stalls: np.ndarray) -> tuple[np.ndarray, int]:
    """The hop of every chunk whose way spanned no stall of the machine (ms), and how
    many were left out because one did."""
    written, received = _hops(stamps, seen)
    stalled = overlaps_stall(written, received, stalls)
    return (received[~stalled] - written[~stalled]) * 1000, int(stalled.sum())


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class TapBench:
    chunks: int
    direct_p50_ms: float
    direct_p99_ms: float
    tap_p50_ms: float
    tap_p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    chunks_per_s: float
    #: CPU seconds per 1,000 chunks: also the share of a core at 1,000 chunks/s
    tap_cpu_s_per_1000: float
    #: None: inconclusive (the straight hop's own P99 is above NOISE_P99_MS)
    p99_met: bool | None
    cpu_met: bool
    #: the tap's own histogram (`shadow_tap_added_latency_seconds`): from a chunk's
    #: arrival from the engine to its hand-off to the client, the upper bound of the
    #: bucket holding P50 / P99. What the tap's code adds, without the extra loopback hop
    #: and the scheduler's waits that the end-to-end difference carries.
    handoff_p50_ms: float | None = None
    handoff_p99_ms: float | None = None
    #: the machine's stalls while the streams ran (`bench.stalls`: a heartbeat that could
    #: not run for over 5 ms), their total length, and the chunks of each path whose hop
    #: spanned one: left out of both paths' percentiles, which measure the rest
    stalls: int = 0
    stalled_s: float = 0.0
    direct_stalled: int = 0
    tap_stalled: int = 0
    #: the CPUs vLLM ran on and those of the measuring side; None: not pinned, all shared
    engine_cpus: list[int] | None = None
    measure_cpus: list[int] | None = None
    #: the tap's relay thread's scheduling slice (us) as the kernel shows it (None: not
    #: shown); `shadow tap` asks for 100 (`connectors.tap.scheduling`)
    tap_slice_us: float | None = None


def split_cpus() -> tuple[set[int], set[int]] | None:
    """The CPUs this process may use, split in two: the first half for vLLM, the rest for
    the measuring side (recorder, tap, service, clients). None with a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


@contextlib.contextmanager
def _on_cpus(cpus: set[int] | None) -> Iterator[None]:
    """This process, and what it starts meanwhile, on `cpus` (None: as it is); its own
    CPUs again after, even when the block raises."""
    mine = os.sched_getaffinity(0)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


#: the recorder's process: `recorder_main(port, engine URL)`
RECORDER_MAIN = (
    "import sys; from shadow.bench.tap import recorder_main; "
    "recorder_main(int(sys.argv[1]), sys.argv[2])"
)


def run(
    requests: int = 48, concurrency: int = 8, max_tokens: int = 128, pin: bool = True
) -> TapBench:
    """`pin`: vLLM on CPUs of its own, the rest for everything else (`split_cpus`)."""
    python = vllm_python()
    split = split_cpus() if pin else None
    with tempfile.TemporaryDirectory(prefix="shadow-bench-tap-") as tmp:
        work = Path(tmp)
        with _on_cpus(split[0] if split else None):  # vLLM inherits them
            engine = VllmServer(python, work / "model").start()
        # the measuring side: this process and what it starts
        with _on_cpus(split[1] if split else None):
            service = tap = recorder = None
            try:
                service = ServerProcess(work / "bench.duckdb").start()
                recorder_port, tap_port, metrics_port = free_ports(3)
                recorder = subprocess.Popen(
                    [sys.executable, "-c", RECORDER_MAIN, str(recorder_port), engine.url],
                    cwd=REPO,
                )
                recorder_url = f"http://127.0.0.1:{recorder_port}"
                _wait_http(recorder_url + "/__record", recorder)
                tap = subprocess.Popen(
                    [sys.executable, "-m", "shadow.cli", "tap", "--service", service.url,
                     "--engine", f"worker=w0,upstream={recorder_url},listen=127.0.0.1:{tap_port}",
                     "--metrics-listen", f"127.0.0.1:{metrics_port}"],
                    cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                )  # fmt: skip
                _wait_http(f"http://127.0.0.1:{metrics_port}/metrics", tap)
                tap_slice = current_slice_us(tap.pid)  # its main thread: the relay's
                tap_url = f"http://127.0.0.1:{tap_port}"
                asyncio.run(_streams(recorder_url, concurrency, concurrency, 16, "warm"))
                asyncio.run(_streams(tap_url, concurrency, concurrency, 16, "warmtap"))
                _recorded(recorder_url)
                metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
                handoff_before = _handoff_buckets(httpx.get(metrics_url).text)
                heartbeat = Heartbeat(work / "stalls.json").start()
                cpu_before, started = _cpu_seconds(tap.pid), time.perf_counter()
                direct, through = asyncio.run(_both(recorder_url, tap_url, requests, concurrency,
                                                    max_tokens))  # fmt: skip
                elapsed, cpu = time.perf_counter() - started, _cpu_seconds(tap.pid) - cpu_before
                stalls = heartbeat.stop()
                handoff_after = _handoff_buckets(httpx.get(metrics_url).text)
                stamps = _recorded(recorder_url)[0]
                (direct_ms, direct_stalled), (tap_ms, tap_stalled) = (
                    _hop_ms(stamps, direct, stalls), _hop_ms(stamps, through, stalls))  # fmt: skip
            finally:
                if tap is not None and tap.poll() is None:
                    tap.send_signal(signal.SIGINT)
                    tap.wait(timeout=30)
                if recorder is not None:
                    recorder.terminate()
                    recorder.wait(timeout=30)
                if service is not None:
                    service.stop()
                engine.stop()
    chunks = len(tap_ms) + tap_stalled
    d50, d99 = (float(np.percentile(direct_ms, q)) for q in (50, 99))
    t50, t99 = (float(np.percentile(tap_ms, q)) for q in (50, 99))
    per_1000 = cpu / chunks * 1000
    handoff = {b: handoff_after[b] - handoff_before.get(b, 0.0) for b in handoff_after}
    return TapBench(
        chunks=chunks, direct_p50_ms=d50, direct_p99_ms=d99, tap_p50_ms=t50, tap_p99_ms=t99,
        added_p50_ms=t50 - d50, added_p99_ms=t99 - d99, chunks_per_s=chunks / elapsed,
        tap_cpu_s_per_1000=per_1000,
        p99_met=None if d99 > NOISE_P99_MS else t99 - d99 <= TARGET_P99_ADDED_MS,
        cpu_met=per_1000 <= TARGET_CPU_S_PER_1000,
        handoff_p50_ms=_bucket_quantile(handoff, 0.50),
        handoff_p99_ms=_bucket_quantile(handoff, 0.99),
        stalls=len(stalls), stalled_s=float((stalls[:, 1] - stalls[:, 0]).sum()),
        direct_stalled=direct_stalled, tap_stalled=tap_stalled,
        engine_cpus=sorted(split[0]) if split else None,
        measure_cpus=sorted(split[1]) if split else None,
        tap_slice_us=tap_slice,
    )  # fmt: skip


def _handoff_buckets(page: str) -> dict[float, float]:
    """The tap's hand-off histogram: cumulative count per bucket upper bound (seconds)."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(page):
        if family.name == "shadow_tap_added_latency_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    out[float(sample.labels["le"])] = sample.value
    return out


def _bucket_quantile(cumulative: dict[float, float], q: float) -> float | None:
    """The upper bound (ms) of the first bucket holding quantile `q`; None without data."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    total = cumulative[bounds[-1]]
    for bound in bounds:
        if cumulative[bound] >= q * total:
            return bound * 1000
    return None


def _wait_http(url: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"{url}: the process exited: {error}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def as_json(result: TapBench) -> dict:
    return {**asdict(result), "targets": {"added_p99_ms": TARGET_P99_ADDED_MS,
                                          "tap_cpu_s_per_1000": TARGET_CPU_S_PER_1000}}  # fmt: skip
