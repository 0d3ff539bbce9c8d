"""The real-vLLM world: real vLLM servers (the CPU build, the tiny model with dummy
weights), the project's incumbent router in front, `shadow tap` between them, and the
stat-logger plugin inside each server, all sending to a shadow service.

    clients -> router (JSQ, shadow.world.router) -> `shadow tap` (one listener, a path
    prefix per worker, dp_rank pinning) -> vLLM server(s)
    tap, plugin --events--> service;  service --scrapes--> vLLM /metrics

Everything at the boundary is real vLLM: its streams and bodies, its `/metrics`, its own
per-iteration stats through the plugin. The barrier itself stays emulated elsewhere:
dense models are not barrier-synchronised in vLLM (each DP rank steps on its own), and
MoE with data parallelism fails on the CPU build, so this world checks the connectors,
not the barrier cost model.

Workers are named by their global index ("0", "1", ...): a DP=2 server holds workers "0"
and "1" as its ranks (the service's poller maps them by the page's `engine` label), a
DP=1 server one more. vLLM is found through `SHADOW_VLLM_PYTHON`, else this interpreter
if it imports vllm (`vllm_python`); the server gets this checkout on PYTHONPATH plus a
dist-info that declares the plugin's entry point (`entry_point_dir`), so vLLM loads it
without installing the project there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvicorn

from shadow.connectors.sink import HttpEventSink
from shadow.events import WorkerEvent
from shadow.world.emulator import QuietServer
from shadow.world.event_wire import sink_fields
from shadow.world.process import REPO, free_port
from shadow.world.router import Router
from shadow.world.tiny_model import TINY_HIDDEN, TINY_LAYERS

ENV_PYTHON = "SHADOW_VLLM_PYTHON"
SERVED_MODEL = "tiny"
#: OpenMP threads per engine unless OMP_NUM_THREADS says otherwise. Torch's default (one
#: per core) gave each of three engines on a 2-core host two spinning threads: they
#: starved the router, the tap and the service (the tap's P99 hop 1.1-2.7 s, a client
#: that read 6 events after the engine had generated 1,500 tokens) and the tiny model
#: gained nothing from them (`shadow bench tap`: 375 chunks/s, against 613 with one).
TINY_MODEL_OMP_THREADS = "1"


class VllmUnavailable(RuntimeError):
    """No interpreter with vLLM: the message says how to provide one."""


def vllm_python() -> str | None:
    """The interpreter that runs vLLM: `SHADOW_VLLM_PYTHON`, else this one if it has it."""
    candidate = os.environ.get(ENV_PYTHON) or sys.executable
    try:
        probe = subprocess.run([candidate, "-c", "import vllm"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return candidate if probe.returncode == 0 else None


def require_vllm_python() -> str:
    python = vllm_python()
    if python is None:
        raise VllmUnavailable(
            f"no vLLM importable: install the extra (pip install -e '.[vllm]', then uninstall "
            f"torchvision torchaudio torchcodec) or set {ENV_PYTHON} to an interpreter with "
            f"vLLM (tried {os.environ.get(ENV_PYTHON) or sys.executable})"
        )
    return python


def entry_point_dir(root: Path) -> Path:
    """A dist-info declaring pyproject.toml's entry points, for a checkout not installed
    in vLLM's environment: vLLM finds plugins through `importlib.metadata`, which reads
    `*.dist-info` on sys.path; PYTHONPATH alone (the code) has none."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    info = root / "balanceroute_shadow_checkout-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: balanceroute-shadow-checkout\nVersion: 0.0.0\n"
    )
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children before their children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children.get(p, [])]
        found += below
        frontier = below
    return found


#: first on every vLLM process's PYTHONPATH: its `sitecustomize` asks Linux for the AMX
#: tile state, which vLLM 0.32's CPU attention uses without asking (SIGILL on a first
#: prefill of 1-4 tokens on an AMX machine; the module says more)
AMX_SITE = Path(__file__).with_name("amx_site")


def engine_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a vLLM server of the tiny model here: `base`, with the CPU
    build's settings unless it sets them (1 GiB of KV cache, no thread binding), and
    `AMX_SITE` first on its PYTHONPATH."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", **base}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AMX_SITE), env.get("PYTHONPATH")) if p)
    return env


def build_model(
    python: str, directory: Path, hidden: int = TINY_HIDDEN, layers: int = TINY_LAYERS
) -> Path:
    """The tiny model, built by vLLM's interpreter (it has `tokenizers`; ours need not)."""
    code = (
        "import sys; from pathlib import Path; from shadow.world.tiny_model import "
        "build_tiny_model; build_tiny_model(Path(sys.argv[1]), int(sys.argv[2]), "
        "int(sys.argv[3]))"
    )
    subprocess.run(
        [python, "-c", code, str(directory), str(hidden), str(layers)],
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return directory


@dataclass(frozen=True)
class ServerSpec:
    """One vLLM server: `dp` data-parallel ranks, each one worker."""

    dp: int = 1
    stream_interval: int | None = None
    max_model_len: int = 4096
    #: `--distributed-executor-backend` (e.g. "uni": the model runs in the engine core's
    #: own process, without a worker process and the shared-memory queue both sides of
    #: which spin while a step runs); None: vLLM's default
    executor: str | None = None
    #: niceness of the server's engine processes once ready (0: as started). On a shared
    #: CPU the engines' compute would take the cores from the processes under test (API
    #: server, tap, router, service); a real engine has an accelerator of its own.
    engine_nice: int = 0
    #: OMP_NUM_THREADS for the server unless the environment sets it (None: leave it
    #: unset, so vLLM picks: one torch thread per process for serving)
    omp_threads: str | None = TINY_MODEL_OMP_THREADS


class VllmServer:
    """One `vllm.entrypoints.openai.api_server` process in a process group of its own,
    with the plugin naming its ranks `workers`."""

    def __init__(
        self,
        python: str,
        model: Path,
        spec: ServerSpec,
        workers: list[str],
        plugin_env: dict[str, str],
        log_path: Path,
    ) -> None:
        self.python, self.model, self.spec, self.workers = python, model, spec, workers
        self.plugin_env = plugin_env
        self.log_path = log_path
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmServer:
        command = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            SERVED_MODEL,
            "--load-format",
            "dummy",
            "--enforce-eager",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(self.spec.max_model_len),
            "--port",
            str(self.port),
            "--data-parallel-size",
            str(self.spec.dp),
        ]
        if self.spec.stream_interval is not None:
            command += ["--stream-interval", str(self.spec.stream_interval)]
        if self.spec.executor is not None:
            command += ["--distributed-executor-backend", self.spec.executor]
        workers = ",".join(f"{i}={w}" for i, w in enumerate(self.workers))
        env = engine_environment(
            {**os.environ, **self.plugin_env, "SHADOW_PLUGIN_WORKERS": workers}
        )
        omp = os.environ.get("OMP_NUM_THREADS", self.spec.omp_threads)
        if omp is None:
            env.pop("OMP_NUM_THREADS", None)
        else:
            env["OMP_NUM_THREADS"] = omp
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited while starting: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM did not start in {timeout} s: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    self._renice_engines()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)

    def _renice_engines(self) -> None:
        """The API server's descendants (engine cores, workers, the DP coordinator) at
        `engine_nice`; the API server itself stays as it was."""
        if not self.spec.engine_nice or self.process is None:
            return
        for pid in descendants(self.process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.setpriority(os.PRIO_PROCESS, pid, self.spec.engine_nice)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """Crash it (SIGKILL to the whole group: API server and engine cores)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        if self._signal(signal.SIGTERM):
            assert self.process is not None
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        self._signal(signal.SIGKILL)  # engine cores left behind by a dead API server

    def _signal(self, signum: int) -> bool:
        if self.process is None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)
            if signum == signal.SIGKILL:
                self.process.wait()
            return True
        return False


class TapProcess:
    """`shadow tap --config FILE` as a child process: one shared listener, worker w
    behind the path prefix `/w`, `dp_rank` pinning the ranks of a DP server."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.config_path, self.log_path = config_path, log_path
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_config(
        self,
        *,
        service: str,
        token_file: Path | None,
        fleet: str,
        source: str,
        policy: str,
        progress_interval_s: float,
        engines: list[tuple[str, str, int | None]],
        capacity: int,
    ) -> None:
        """`engines`: (worker, upstream URL, dp_rank or None)."""
        lines = [
            "[tap]",
            f'service = "{service}"',
            f'fleet = "{fleet}"',
            f'source = "{source}"',
            f'listen = "127.0.0.1:{self.port}"',
            f'policy = "{policy}"',
            f"progress_interval_s = {progress_interval_s}",
        ]
        if token_file is not None:
            lines.append(f'token_file = "{token_file}"')
        for worker, upstream, rank in engines:
            lines += [
                "[[tap.engines]]",
                f'worker = "{worker}"',
                f'upstream = "{upstream}"',
                f'path_prefix = "/{worker}"',
                f"capacity = {capacity}",
            ]
            if rank is not None:
                lines.append(f"dp_rank = {rank}")
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 60.0) -> TapProcess:
        command = [sys.executable, "-m", "shadow.cli", "tap", "--config", str(self.config_path)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"shadow tap exited: {self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/metrics", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(f"shadow tap did not answer on {self.url}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@dataclass(frozen=True)
class RealWorldOptions:
    #: one DP=2 server by default: workers "0" and "1"
    servers: tuple[ServerSpec, ...] = (ServerSpec(dp=2),)
    #: slots the router and the tap announce per worker
    capacity: int = 16
    router_policy: str = "jsq-pool"
    progress_interval_s: float = 0.1
    fleet: str = "default"
    token_file: Path | None = None
    #: a tag unique to this start: the sources carry it (see WorldOptions.incarnation)
    incarnation: int | None = None
    #: set on the server environments (e.g. SHADOW_PLUGIN_MAX_QUEUE)
    plugin_env: dict[str, str] = field(default_factory=dict)
    #: the model's shape (tiny_model.build_tiny_model): heavier steps for a world whose
    #: streams must not outrun vLLM's API server on a shared CPU
    model_hidden: int = TINY_HIDDEN
    model_layers: int = TINY_LAYERS


@dataclass(frozen=True)
class RealWorldAddresses:
    """As `WorldAddresses`: `workers` maps worker -> its server's base URL (the ranks of a
    DP server share one, told apart by `engines`: worker -> DP rank label)."""

    router: str
    tap: str
    workers: dict[str, str]
    engines: dict[str, str]


class RealWorld:
    """Start with `start()` (blocking, minutes at worst: run it off an event loop), then
    `serve_router()` inside the loop that will carry the traffic; `stop()` ends it all."""

    def __init__(
        self,
        service_url: str,
        workdir: Path,
        options: RealWorldOptions | None = None,
        python: str | None = None,
    ) -> None:
        self.options = options or RealWorldOptions()
        self.service_url = service_url.rstrip("/")
        self.workdir = workdir
        self.python = python or require_vllm_python()
        tag = "" if self.options.incarnation is None else f"-{self.options.incarnation}"
        self.tag = tag
        o = self.options
        eps = self.workdir / "entry-points"
        path = os.pathsep.join([str(eps), str(REPO), os.environ.get("PYTHONPATH", "")])
        plugin_env = {
            "PYTHONPATH": path.rstrip(os.pathsep),
            "SHADOW_PLUGIN_URL": self.service_url,
            "SHADOW_PLUGIN_FLEET": o.fleet,
            **o.plugin_env,
        }
        if o.token_file is not None:
            plugin_env["SHADOW_PLUGIN_TOKEN_FILE"] = str(o.token_file)
        #: created here so their ports (and the service's [[engines]]) are known before start
        self.servers: list[VllmServer] = []
        index = 0
        for k, spec in enumerate(o.servers):
            workers = [str(index + r) for r in range(spec.dp)]
            index += spec.dp
            self.servers.append(
                VllmServer(
                    self.python,
                    self.workdir / "model",
                    spec,
                    workers,
                    plugin_env,
                    self.workdir / f"vllm-{k}.log",
                )
            )
        self.tap: TapProcess | None = None
        self.router: Router | None = None
        self.health_sink = HttpEventSink(
            self.service_url, source=f"vllm-health{tag}", fleet=self.options.fleet
        )
        self._router_server: QuietServer | None = None
        self._router_task: asyncio.Task[None] | None = None
        self.addresses: RealWorldAddresses | None = None

    def start(self, upstreams: dict[str, str] | None = None) -> None:
        """Model, servers (one at a time: two starting at once starve 2 cores), tap.
        `upstreams`: a server URL -> what the tap calls instead (a recording proxy)."""
        o = self.options
        self.workdir.mkdir(parents=True, exist_ok=True)
        build_model(
            self.python, self.workdir / "model", self.options.model_hidden,
            self.options.model_layers,
        )  # fmt: skip
        entry_point_dir(self.workdir / "entry-points")
        upstreams = upstreams or {}
        try:
            for server in self.servers:
                server.start().wait_ready()
            self.tap = TapProcess(self.workdir / "tap.toml", self.workdir / "tap.log")
            self.tap.write_config(
                service=self.service_url,
                token_file=o.token_file,
                fleet=o.fleet,
                source=f"tap{self.tag}",
                policy=o.router_policy,
                progress_interval_s=o.progress_interval_s,
                capacity=o.capacity,
                engines=[
                    (w, upstreams.get(s.url, s.url), r if s.spec.dp > 1 else None)
                    for s in self.servers
                    for r, w in enumerate(s.workers)
                ],
            )
            self.tap.start()
        except BaseException:
            self.stop_processes()
            raise

    def worker_urls(self) -> dict[str, str]:
        return {w: s.url for s in self.servers for w in s.workers}

    def engine_labels(self) -> dict[str, str]:
        return {w: str(r) for s in self.servers for r, w in enumerate(s.workers)}

    def server_of(self, worker: str) -> VllmServer:
        return next(s for s in self.servers if worker in s.workers)

    async def serve_router(self) -> RealWorldAddresses:
        """The incumbent router on a loopback port, in the running loop. It announces
        nothing itself: the tap names requests by vLLM's own ids (what the plugin reports
        at finish) and announces `ready` and `dispatch` under them."""
        assert self.tap is not None, "start() first"
        await self.health_sink.start()
        self.router = Router(
            list(self.worker_urls()),
            self.tap.url,
            capacity=self.options.capacity,
            policy=self.options.router_policy,
        )
        port = free_port()
        self._router_server = QuietServer(
            uvicorn.Config(
                self.router.app,
                host="127.0.0.1",
                port=port,
                log_level="warning",
                timeout_keep_alive=120,
            )
        )
        self._router_task = asyncio.create_task(self._router_server.serve())
        while not self._router_server.started:
            if self._router_task.done():
                raise OSError(f"the router cannot listen on 127.0.0.1:{port}")
            await asyncio.sleep(0.01)
        self.addresses = RealWorldAddresses(
            f"http://127.0.0.1:{port}", self.tap.url, self.worker_urls(), self.engine_labels()
        )
        return self.addresses

    def kill_server(self, k: int) -> list[str]:
        """Crash server `k` and report its workers down as the engines' health would (a
        `worker` down event from a source of its own: one failed request through the tap
        marks nothing down). Returns the workers it held."""
        server = self.servers[k]
        server.kill()
        for worker in server.workers:
            down = WorkerEvent(
                ts=time.time(), worker=worker, capacity=self.options.capacity, state="down"
            )
            self.health_sink.put(sink_fields(down))
        return list(server.workers)

    async def stop_router(self) -> None:
        if self._router_server is not None and self._router_task is not None:
            self._router_server.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._router_task, 10)
        await self.health_sink.aclose()

    def stop_processes(self) -> None:
        """The tap, then every server (each by its process group); safe to call twice."""
        if self.tap is not None:
            self.tap.stop()
        for server in self.servers:
            server.stop()
