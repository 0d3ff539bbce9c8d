"""`shadow serve` as a child process on a loopback port, for benchmarks, tests and
harnesses that need a real server they can kill."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    return free_ports(1)[0]


#: where ports are picked when the kernel's ephemeral range cannot be read (Linux's default)
EPHEMERAL_DEFAULT = (32768, 60999)
#: the lowest port picked
LOWEST_PORT = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_DEFAULT[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each is held until all are picked (two `free_port`
    calls in a row can return the same port, and the tap then refused its config).

    Picked below the kernel's ephemeral range, never by `bind(0)`: a port the kernel hands
    out is one it also hands to outbound connections and to other `bind(0)` callers, and
    a real vLLM server, given its port before the DP=2 server beside it had started (its
    engines, coordinator and connections taking ephemeral ports), failed a fresh-clone CI
    with "Address already in use" at startup."""
    rng = random.SystemRandom()
    low = _ephemeral_low()
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        for port in rng.sample(range(LOWEST_PORT, max(low, LOWEST_PORT + 1000)), 500):
            sock = held.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
    raise OSError(f"no {count} free ports between {LOWEST_PORT} and {low}")


class ServerProcess:
    def __init__(
        self,
        db: Path,
        config: Path | None = None,
        *,
        demo: bool = False,
        port: int | None = None,
        own_group: bool = False,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`own_group`: the server and its workers in a process group of their own, to be
        signalled together as Ctrl-C or `timeout` would (`signal_group`). `cwd`: where it
        runs (a relative `db` is read from there; default the checkout). `env`: variables
        added to its environment (`SHADOW_*` settings beside the demo's defaults, which a
        config file would replace)."""
        self.db = db
        self.config = config
        self.demo = demo
        self.own_group = own_group
        self.cwd = cwd or REPO
        self.env = env or {}
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        """Launch the server and wait until it answers `/healthz`."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> ServerProcess:
        """Start the process without waiting for it (its output is `process.stdout`)."""
        command = [sys.executable, "-m", "shadow.cli", "serve", "--db", str(self.db),
                   "--port", str(self.port), "--demo" if self.demo else "--no-demo"]  # fmt: skip
        if self.config is not None:
            command += ["--config", str(self.config)]
        self.process = subprocess.Popen(
            command,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            start_new_session=self.own_group,
        )
        return self

    def wait_ready(self, timeout: float = 60.0) -> ServerProcess:
        """Wait until the launched server answers `/healthz`; its output if it exits."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.process.stdout.read().decode() if self.process.stdout else ""
                raise RuntimeError(f"shadow serve exited: {output}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(f"shadow serve did not answer on {self.url} within {timeout} s")

    def signal_group(self, signum: int) -> None:
        """Signal the server's whole process group (started with `own_group`)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
