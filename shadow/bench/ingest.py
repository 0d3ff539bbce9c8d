"""Sustained ingest rate with the decision audit and the invariants on, for an 8-worker
recorded log (a JSQ replay of the `paper-azure2024` preset): from a file through the
pipeline `shadow ingest` uses, and over HTTP in batches through `shadow serve`."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb
import httpx

from shadow.bench.workspace import workspace
from shadow.events import iter_file
from shadow.policies import make_policy
from shadow.replay import replay
from shadow.replay.events import write_events
from shadow.replay.workload import StepModel
from shadow.service.runtime import Runtime
from shadow.service.settings import load_settings
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime
from shadow.world.process import ServerProcess


@dataclass(frozen=True)
class IngestBench:
    path: str
    events: int
    seconds: float
    events_per_s: float
    target: float


@dataclass(frozen=True)
class Recording:
    log: Path
    events: int
    fleet_seconds: float


def record(root: Path, requests: int, seed: int = 0) -> Recording:
    model = StepModel()
    workload = retime(
        generate("paper-azure2024", seed=seed, n=requests), load=1.0, workers=8, batch=64,
        step_model=model,
    )  # fmt: skip
    result = replay(workload, make_policy("jsq-pool"), workers=8, batch=64, step_model=model)
    log = root / "recorded.jsonl"
    count = write_events(log, result, workload.prompt_keys)
    return Recording(log, count, float(result.step_end_ms[-1]) / 1000.0)


def bench_file(recording: Recording, db: Path) -> IngestBench:
    settings = load_settings(None, db=db, windows=False)
    runtime = Runtime(settings)
    try:
        started = time.perf_counter()
        for pairs, errors in iter_file(recording.log, batch_size=10_000):
            runtime.pipeline.submit(pairs, errors)
        runtime.pipeline.drain()  # applies the rest and waits for every audit
        seconds = time.perf_counter() - started
    finally:
        runtime.close()
    return IngestBench("file", recording.events, seconds, recording.events / seconds, 50_000)


def bench_http(recording: Recording, db: Path, batch: int = 1000) -> IngestBench:
    config = db.with_suffix(".toml")
    config.write_text("windows = false\n")
    server = ServerProcess(db, config).start()
    lines = recording.log.read_bytes().splitlines(keepends=True)
    bodies = [b"".join(lines[i : i + batch]) for i in range(0, len(lines), batch)]
    try:
        with httpx.Client(timeout=120) as client:
            started = time.perf_counter()
            for body in bodies:
                response = client.post(f"{server.url}/v1/events", content=body)
                response.raise_for_status()
            client.post(f"{server.url}/v1/flush").raise_for_status()
            seconds = time.perf_counter() - started
    finally:
        server.stop()
    return IngestBench(
        f"http (batches of {batch})", recording.events, seconds, recording.events / seconds,
        20_000,
    )  # fmt: skip


def database_size(db: Path) -> int:
    """Bytes of the database file after a checkpoint (the WAL folded in)."""
    with duckdb.connect(str(db)) as connection:
        connection.execute("CHECKPOINT")
    return db.stat().st_size


def run(requests: int = 10_000, workdir: Path | None = None) -> dict:
    """Both ingest benchmarks in `workdir` (kept), or in a temporary folder (`workspace`)."""
    with workspace(workdir, "shadow-bench-") as root:
        return _run_in(root, requests)


def _run_in(root: Path, requests: int) -> dict:
    recording = record(root, requests)
    file_result = bench_file(recording, root / "file.duckdb")
    size = database_size(root / "file.duckdb")
    http_result = bench_http(recording, root / "http.duckdb")
    per_day = size * 86_400 / recording.fleet_seconds
    return {
        "log": {"events": recording.events, "fleet_seconds": recording.fleet_seconds},
        "results": [asdict(file_result), asdict(http_result)],
        "database_bytes": size,
        "database_bytes_per_day_8_workers": per_day,
    }
