"""Sustained ingest rate with the decision audit and the invariants on, for an 8-worker
recorded log (a JSQ replay of the `paper-azure2024` preset): from a file through the
pipeline `shadow ingest` uses, and over HTTP in batches through `shadow serve`.

With `counterfactuals` the windows are on too: every candidate's continuous
counterfactual replays the fleet in the window worker beside the ingest. The clock then
stops only once the last window is stored (the end of input closes the last window,
which drains the runs), so the rate is what the service sustains with all of its
evidence made, not only what it acknowledges; the rate at the last acknowledgement is
reported beside it."""

from __future__ import annotations

import os
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
from shadow.service.footprint import cpu_seconds, process_tree
from shadow.service.runtime import Runtime
from shadow.service.settings import load_settings
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime
from shadow.world.process import ServerProcess


@dataclass(frozen=True)
class IngestBench:
    path: str
    events: int
    #: until everything is stored: the events, their audits and (with the windows on)
    #: every window the log makes
    seconds: float
    events_per_s: float
    target: float
    #: windows stored (None: windows off)
    windows: int | None = None
    #: until the last event was applied and acknowledged (with the windows on, the
    #: windows' evaluation may still be running then)
    acknowledged_seconds: float | None = None
    #: CPU per event (us) by process, over the pass: the ingest (this process, or the
    #: server) and each worker role (None: its processes changed during the pass); on
    #: two cores it shows which one sets the rate
    cpu_us_per_event: dict[str, float | None] | None = None


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


def bench_file(recording: Recording, db: Path, counterfactuals: bool = False) -> IngestBench:
    settings = load_settings(None, db=db, windows=counterfactuals)
    runtime = Runtime(settings)
    try:
        runtime.start_ingesting()  # as `shadow ingest` does before its first batch
        pids = _file_roles(runtime)
        cpu_before = _cpu_by_role(pids)
        started = time.perf_counter()
        for pairs, errors in iter_file(recording.log, batch_size=10_000):
            runtime.pipeline.submit(pairs, errors)
        runtime.pipeline.drain()  # applies the rest and waits for every audit
        acknowledged = time.perf_counter() - started
        windows = None
        if counterfactuals:
            runtime.pipeline.finish()  # closes the last window, waits for every window
            windows = runtime.pipeline.windows_evaluated
        seconds = time.perf_counter() - started
        cpu = _cpu_per_event(pids, cpu_before, _file_roles(runtime), recording.events)
    finally:
        runtime.close()
    return IngestBench("file", recording.events, seconds, recording.events / seconds, 50_000,
                       windows, acknowledged, cpu)  # fmt: skip


def _file_roles(runtime: Runtime) -> dict[str, list[int]]:
    """The file pass's processes by role: this one ingests, beside the worker roles."""
    return {"ingest": [os.getpid()], **runtime.worker_pids()}


def _server_roles(pid: int) -> dict[str, list[int]]:
    """The HTTP pass's processes by role: the server, and its children (the worker
    processes, and multiprocessing's resource tracker, idle)."""
    tree = process_tree(pid)
    return {"server": tree[:1], "workers": tree[1:]}


def _cpu_by_role(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far by each role's processes (a process gone counts 0)."""
    return {role: sum(cpu_seconds(pid) or 0.0 for pid in group) for role, group in pids.items()}


def _cpu_per_event(
    pids: dict[str, list[int]],
    before: dict[str, float],
    pids_after: dict[str, list[int]],
    events: int,
) -> dict[str, float | None]:
    """Each role's CPU over the pass per event (us); None for a role whose processes
    changed meanwhile (one replaced or gone: its CPU is not all counted). /proc counts
    in ticks of 10 ms, so a small log's figures are coarse."""
    after = _cpu_by_role(pids_after)
    return {
        role: (after[role] - before[role]) / events * 1e6
        if sorted(pids_after.get(role, ())) == sorted(group)
        else None
        for role, group in pids.items()
    }


def bench_http(
    recording: Recording,
    db: Path,
    batch: int = 1000,
    *,
    counterfactuals: bool = False,
    windows_expected: int | None = None,
    windows_timeout_s: float = 600.0,
) -> IngestBench:
    """Over HTTP; with `counterfactuals`, the clock runs until the service has stored
    `windows_expected` windows (the file pass's count: the same log makes the same
    windows), asking with `POST /v1/flush?final=true` as a client at the end of its
    traffic does."""
    config = db.with_suffix(".toml")
    config.write_text(f"windows = {'true' if counterfactuals else 'false'}\n")
    server = ServerProcess(db, config).start()
    lines = recording.log.read_bytes().splitlines(keepends=True)
    bodies = [b"".join(lines[i : i + batch]) for i in range(0, len(lines), batch)]
    windows = None
    try:
        assert server.process is not None
        pids = _server_roles(server.process.pid)
        cpu_before = _cpu_by_role(pids)
        with httpx.Client(timeout=120) as client:
            started = time.perf_counter()
            for body in bodies:
                response = client.post(f"{server.url}/v1/events", content=body)
                response.raise_for_status()
            flush = client.post(f"{server.url}/v1/flush", params={"final": counterfactuals})
            flush.raise_for_status()
            acknowledged = time.perf_counter() - started
            if counterfactuals:
                windows = _wait_for_windows(client, server.url, windows_expected,
                                            started + windows_timeout_s)  # fmt: skip
            seconds = time.perf_counter() - started
        cpu = _cpu_per_event(pids, cpu_before, _server_roles(server.process.pid), recording.events)
    finally:
        server.stop()
    return IngestBench(
        f"http (batches of {batch})", recording.events, seconds, recording.events / seconds,
        20_000, windows, acknowledged, cpu,
    )  # fmt: skip


def _wait_for_windows(client: httpx.Client, url: str, expected: int | None, deadline: float) -> int:
    """Ask for the stored windows until `expected` are (or, without an expectation, until
    the count has not moved for 5 s); past `deadline`, the bench fails naming the count."""
    last, still_since = -1, time.perf_counter()
    while True:
        response = client.post(f"{url}/v1/flush", params={"final": True})
        response.raise_for_status()
        count = int(response.json()["windows_evaluated"])
        now = time.perf_counter()
        if expected is not None and count >= expected:
            return count
        if count != last:
            last, still_since = count, now
        elif expected is None and now - still_since >= 5.0:
            return count
        if now > deadline:
            raise TimeoutError(
                f"the service stored {count} of {expected} windows before the bench's deadline"
            )
        time.sleep(0.1)


def database_size(db: Path) -> int:
    """Bytes of the database file after a checkpoint (the WAL folded in)."""
    with duckdb.connect(str(db)) as connection:
        connection.execute("CHECKPOINT")
    return db.stat().st_size


def run(requests: int = 10_000, workdir: Path | None = None, counterfactuals: bool = False) -> dict:
    """Both ingest benchmarks in `workdir` (kept), or in a temporary folder (`workspace`)."""
    with workspace(workdir, "shadow-bench-") as root:
        return _run_in(root, requests, counterfactuals)


def _run_in(root: Path, requests: int, counterfactuals: bool) -> dict:
    recording = record(root, requests)
    file_result = bench_file(recording, root / "file.duckdb", counterfactuals)
    size = database_size(root / "file.duckdb")
    http_result = bench_http(recording, root / "http.duckdb", counterfactuals=counterfactuals,
                             windows_expected=file_result.windows)  # fmt: skip
    per_day = size * 86_400 / recording.fleet_seconds
    return {
        "log": {"events": recording.events, "fleet_seconds": recording.fleet_seconds},
        "counterfactuals": counterfactuals,
        "results": [asdict(file_result), asdict(http_result)],
        "database_bytes": size,
        "database_bytes_per_day_8_workers": per_day,
    }
