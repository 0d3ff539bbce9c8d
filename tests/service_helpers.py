"""Shared pieces of the service tests: recorded traffic, a real server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from ingest.synthetic import generate
from ingest.traces import retime
from shadow.policies import make_policy
from shadow.replay import replay
from shadow.replay.events import write_events
from shadow.service.process import ServerProcess
from shadow.workload import StepModel


def record(path: Path, requests: int = 2500, seed: int = 0, load: float = 1.0):
    """A JSQ replay of the paper preset, emitted as an event log (known ground truth)."""
    model = StepModel()
    workload = retime(
        generate("paper-azure2024", seed=seed, n=requests),
        load=load,
        workers=8,
        batch=64,
        step_model=model,
    )
    result = replay(workload, make_policy("jsq"), workers=8, batch=64, step_model=model)
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
    lines = [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
