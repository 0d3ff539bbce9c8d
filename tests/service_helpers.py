"""Shared pieces of the service tests: recorded traffic, a real server on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn

from shadow.policies import make_policy
from shadow.replay import replay
from shadow.replay.events import write_events
from shadow.replay.workload import StepModel
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime
from shadow.world.process import ServerProcess


def record(path: Path, requests: int = 2500, seed: int = 0, load: float = 1.0):
    """A pooled-JSQ (`jsq-pool`, the emulated world's router) replay of the paper preset,
    emitted as an event log (known ground truth)."""
    model = StepModel()
    workload = retime(
        generate("paper-azure2024", seed=seed, n=requests),
        load=load,
        workers=8,
        batch=64,
        step_model=model,
    )
    result = replay(workload, make_policy("jsq-pool"), workers=8, batch=64, step_model=model)
    write_events(path, result, workload.prompt_keys)
    return result, workload


Server = ServerProcess


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
    """A settings file from flat names (the programmatic spelling), written in the sectioned
    spelling a config file uses: flat names there are deprecated, and every service the
    tests started printed the warning."""
    from shadow.service.settings import FLAT_NAMES

    top: list[str] = []
    sections: dict[str, list[str]] = {}
    for name, value in values.items():
        if name in FLAT_NAMES:
            section, key = FLAT_NAMES[name]
            sections.setdefault(section, []).append(f"{key} = {json.dumps(value)}")
        else:
            top.append(f"{name} = {json.dumps(value)}")
    lines = top + [line for section, keys in sections.items() for line in (f"[{section}]", *keys)]
    path.write_text("\n".join(lines) + "\n")
    return path


class ThreadedServer:
    """An ASGI app on a loopback port, served by uvicorn in a daemon thread: the test
    fakes (a streaming engine, a /metrics endpoint, a Grafana) all run this way."""

    def __init__(self, app: object, *, port: int = 0, **config: object) -> None:
        self.app = app
        self.port = port
        self.config = {"log_level": "warning", "lifespan": "off", **config}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> ThreadedServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart on the same port
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, **self.config))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            assert self._thread.is_alive(), "test server stopped while starting (see its log)"
            assert time.monotonic() < deadline, "test server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            assert not self._thread.is_alive(), "test server did not stop"
        self._server = self._thread = None


@contextmanager
def served(app: object) -> Iterator[httpx.Client]:
    """The service's app over real HTTP on loopback (uvicorn in a thread, its lifespan
    run), and a client for it: what `fastapi.testclient` did in-process, on the wire."""
    server = ThreadedServer(app, lifespan="on").start(timeout_s=60.0)
    try:
        with httpx.Client(base_url=server.url, timeout=60.0) as client:
            yield client
    finally:
        server.stop()
