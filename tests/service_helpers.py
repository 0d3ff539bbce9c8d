"""Shared pieces of the service tests: recorded traffic, a real server on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ingest.synthetic import generate
from ingest.traces import retime
from shadow.policies import make_policy
from shadow.replay import replay
from shadow.replay.events import write_events
from shadow.workload import StepModel

REPO = Path(__file__).resolve().parents[1]


def record(path: Path, requests: int = 2500, seed: int = 0):
    """A JSQ replay of the paper preset, emitted as an event log (known ground truth)."""
    model = StepModel()
    workload = retime(
        generate("paper-azure2024", seed=seed, n=requests),
        load=1.0,
        workers=8,
        batch=64,
        step_model=model,
    )
    result = replay(workload, make_policy("jsq"), workers=8, batch=64, step_model=model)
    write_events(path, result, workload.prompt_keys)
    return result, workload


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`shadow serve` in its own process on a loopback port."""

    def __init__(self, db: Path, config: Path | None = None) -> None:
        self.db = db
        self.config = config
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Server:
        command = [sys.executable, "-m", "shadow.cli", "serve", "--db", str(self.db),
                   "--port", str(self.port)]  # fmt: skip
        if self.config is not None:
            command += ["--config", str(self.config)]
        self.process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.process.stdout.read().decode()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError("server did not come up")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def batches(path: Path, size: int = 1000) -> list[bytes]:
    lines = path.read_bytes().splitlines(keepends=True)
    return [b"".join(lines[i : i + size]) for i in range(0, len(lines), size)]


def post(client: httpx.Client, url: str, body: bytes) -> dict:
    response = client.post(
        f"{url}/v1/events", content=body, headers={"content-type": "application/x-ndjson"}
    )
    assert response.status_code == 200, response.text
    return response.json()


def mirror_state(client: httpx.Client, url: str) -> dict:
    snapshot = client.get(f"{url}/v1/fleets/default/snapshot").json()
    return {
        "workers": [
            (w["worker"], w["active"], w["kv_tokens"], w["steps"]) for w in snapshot["workers"]
        ],
        "pool": snapshot["pool"],
    }


def write_config(path: Path, **values: object) -> Path:
    lines = [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
