"""Can the service keep pace with a wide-EP fleet (issue 24)? G = 256 data-parallel decode
workers of B = 128, audited in real time.

The stream is a JSQ replay of the long-output `paper-azure2024` preset retimed to load 1.0
on that fleet, with a step model of ~60 ms at full batch (`FLEET_STEP_MODEL`): engine
steps, progress coalesced every 64 tokens, ready, dispatch and finish, cut at `minutes`
of fleet time. The fleet starts empty and fills within about one request's life (~1,000
steps, a minute), so the first minute is the ramp; the 30 s samples show it.

Three passes over it:

- audit cost: the decision audit alone (`AuditFollower`, every dispatch, in this process),
  the wall time of each dispatch's audit and each policy's share (its `latency_ms`);
- file: the pipeline `shadow ingest` uses (audit worker process, invariants), as fast as
  it goes, sampled every 30 s of fleet time;
- HTTP: `shadow serve` in a child process, fed by one source at the fleet's real-time
  rate (a POST per `slice_s` of fleet time, sent when that slice has happened), sampled
  every 30 s: how far behind schedule the source is, the audit's lag
  (`shadow_audit_lag_seconds`), CPU per event and resident memory per process; then
  every acknowledged event is looked up in the database.

With `counterfactuals=True` the passes also evaluate the windows: each candidate's
continuous counterfactual (stream/continuous.py) runs in the window worker process.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import httpx
import msgspec
import numpy as np

from shadow.bench.fleet_samples import Sample, footprint, sample_line, summarize_pass
from shadow.bench.scrape import metric_sum, metric_value
from shadow.bench.stored import stored_events
from shadow.bench.workspace import workspace
from shadow.events import iter_file
from shadow.policies import make_policy
from shadow.replay import replay
from shadow.replay.events import DEFAULT_PROGRESS_EVERY, iter_events
from shadow.replay.workload import StepModel
from shadow.service.runtime import Runtime
from shadow.service.settings import load_settings
from shadow.stream.audit import AuditFollower
from shadow.stream.items import (
    AuditRequest,
    DispatchItem,
    EngineStepItem,
    FinishItem,
    ProgressItem,
    ReadyItem,
    StreamItem,
    WorkerItem,
)
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime, target_arrival_rate
from shadow.world.process import ServerProcess

PRESET = "paper-azure2024"
#: ~60 ms a step at B = 128 on the preset (128 x ~5,180 KV tokens at full batch)
FLEET_STEP_MODEL = StepModel(a_ms_per_token=6.0e-5, b_ms=20.0)
#: seconds of fleet time between samples
SAMPLE_S = 30.0
#: the fleet is "full" (its audit cost judged) once it holds this share of G x B requests
FULL_SHARE = 0.9
AUDIT_TARGET_P99_MS = 1.0
NDJSON = {"content-type": "application/x-ndjson"}
#: the fleet name the recorded events carry (replay/events' default)
FLEET = "default"


@dataclass(frozen=True)
class FleetShape:
    workers: int = 256
    batch: int = 128
    minutes: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.workers < 1 or self.batch < 1:
            problems.append(f"workers and batch must be >= 1, got {self.workers}, {self.batch}")
        if not 0 < self.minutes <= 60:
            problems.append(f"minutes must be in (0, 60], got {self.minutes}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class FleetRecording:
    log: Path
    events: int
    by_kind: dict[str, int]
    fleet_seconds: float
    #: requests per second the preset arrives at (load 1.0)
    arrival_rate: float

    @property
    def required_events_per_s(self) -> float:
        """The fleet's real-time event rate: what ingest must sustain."""
        return self.events / self.fleet_seconds


def record(root: Path, shape: FleetShape) -> FleetRecording:
    """Replay the fleet and write its events up to `shape.minutes` of fleet time."""
    base = generate(PRESET, seed=shape.seed)
    rate = target_arrival_rate(
        base, 1.0, workers=shape.workers, batch=shape.batch, step_model=FLEET_STEP_MODEL
    )
    end_s = shape.minutes * 60.0
    workload = retime(
        generate(PRESET, seed=shape.seed, n=max(2, int(rate * end_s))),
        load=1.0, workers=shape.workers, batch=shape.batch, step_model=FLEET_STEP_MODEL,
    )  # fmt: skip
    result = replay(
        workload, make_policy("jsq-pool"), workers=shape.workers, batch=shape.batch,
        step_model=FLEET_STEP_MODEL,
    )  # fmt: skip
    log = root / "fleet.jsonl"
    encode = msgspec.json.Encoder().encode
    by_kind: Counter[str] = Counter()
    last_ts = 0.0
    with log.open("wb") as out:
        for event in iter_events(
            result, workload.prompt_keys, progress_every=DEFAULT_PROGRESS_EVERY
        ):
            if event["ts"] > end_s:
                break
            out.write(encode(event))
            out.write(b"\n")
            by_kind[event["type"]] += 1
            last_ts = event["ts"]
    return FleetRecording(log, sum(by_kind.values()), dict(by_kind), last_ts, rate)


# -- pass 1: the audit alone ----------------------------------------------------------


def _items(log: Path) -> Iterator[StreamItem]:
    """The recording as the audit follower's items, every first dispatch audited."""
    decode = msgspec.json.Decoder().decode
    seen: set[str] = set()
    with log.open("rb") as lines:
        for number, line in enumerate(lines):
            e = decode(line)
            kind, ts, fleet = e["type"], e["ts"], e.get("fleet", "default")
            if kind == "engine_step":
                yield EngineStepItem(ts, fleet, str(e["worker"]), e["step"], e["running"],
                                     e["duration_ms"])  # fmt: skip
            elif kind == "progress":
                yield ProgressItem(ts, fleet, e["request_id"], e["generated"])
            elif kind == "finish":
                yield FinishItem(ts, fleet, e["request_id"], e["output_tokens"], e["reason"])
            elif kind == "ready":
                yield ReadyItem(ts, fleet, e["request_id"], e["prompt_tokens"],
                                e.get("prompt_hash"))  # fmt: skip
            elif kind == "dispatch":
                first = e["request_id"] not in seen
                seen.add(e["request_id"])
                audit = AuditRequest(number, e.get("policy", "jsq-pool"), None) if first else None
                yield DispatchItem(ts, fleet, e["request_id"], str(e["worker"]), audit)
            elif kind == "worker":
                yield WorkerItem(ts, fleet, str(e["worker"]), e["capacity"], e["state"])


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    array = np.asarray(values)
    return {"p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99)),
            "max": float(array.max()), "n": int(array.shape[0])}  # fmt: skip


def audit_cost(recording: FleetRecording, shape: FleetShape) -> dict[str, Any]:
    """Milliseconds per audited dispatch once the fleet is full: the whole audit (snapshot,
    projection, every policy, scores) and each policy's own decision: its round's CPU
    time (`policy_round_ms`, per incumbent round) and that time per dispatch of the round
    (`policy_ms`)."""
    follower = AuditFollower()
    full = FULL_SHARE * shape.workers * shape.batch
    total: list[float] = []
    #: per policy, each round's CPU time and how many dispatches it made (the incumbent's
    #: round: the dispatches at one timestamp, ~30 at G = 256; its time is on its first)
    rounds: dict[str, list[list[float]]] = {}
    audited = 0
    for item in _items(recording.log):
        if item.__class__ is not DispatchItem or item.audit is None:  # type: ignore[attr-defined]
            follower.run([item])
            continue
        started = time.perf_counter()
        outcomes = follower.run([item])
        elapsed = (time.perf_counter() - started) * 1000.0
        audited += 1
        mirror = follower.fleets[item.fleet][0].mirror
        if mirror.running < full or not outcomes:
            continue
        total.append(elapsed)
        for decision in outcomes[0].decisions:
            timed = rounds.setdefault(decision.policy, [])
            if decision.latency_ms is not None:  # a round's first dispatch
                timed.append([decision.latency_ms, 1])
            elif timed:
                timed[-1][1] += 1
    auditor = next(iter(follower.fleets.values()))[1] if follower.fleets else None
    kept = auditor.projection if auditor is not None else None
    return {
        "audited": audited,
        "audit_ms": _percentiles(total),
        "policy_round_ms": {name: _percentiles([ms for ms, _ in timed])
                            for name, timed in rounds.items()},
        # a round's time shared by its dispatches, one value per dispatch
        "policy_ms": {name: _percentiles([ms / n for ms, n in timed for _ in range(int(n))])
                      for name, timed in rounds.items()},
        "projection": None if kept is None else
        {"full_rebuilds": kept.full_rebuilds, "rows_rebuilt": kept.rows_rebuilt},
        "target_p99_ms": AUDIT_TARGET_P99_MS,
    }  # fmt: skip


# -- pass 2: from a file --------------------------------------------------------------


def _service_config(
    db: Path, audit_sampling: bool, counterfactuals: bool = False,
    max_audit_backlog: int | None = None, duckdb_memory_mb: int | None = None,
) -> Path:  # fmt: skip
    """The service's TOML for a pass: windows (the continuous counterfactuals) only when
    asked; the audit's sampling as asked; the audit's backlog bound (sampling starts at
    half of it) and DuckDB's buffer pool the service's defaults unless given."""
    config = db.with_suffix(".toml")
    sampling = "true" if audit_sampling else "false"
    windows = "true" if counterfactuals else "false"
    text = "" if duckdb_memory_mb is None else f"duckdb_memory_mb = {int(duckdb_memory_mb)}\n"
    text += f"[ingest]\nwindows_enabled = {windows}\naudit_sampling = {sampling}\n"
    if max_audit_backlog is not None:
        text += f"[limits]\nmax_audit_backlog = {max_audit_backlog}\n"
    config.write_text(text)
    return config


def ingest_file(
    recording: FleetRecording,
    db: Path,
    note: Callable[[str], None],
    audit_sampling: bool = False,
    counterfactuals: bool = False,
    max_audit_backlog: int | None = None,
    duckdb_memory_mb: int | None = None,
) -> dict:
    """The pipeline of `shadow ingest`, as fast as it goes, with the audit worker."""
    config = _service_config(db, audit_sampling, counterfactuals, max_audit_backlog,
                             duckdb_memory_mb)  # fmt: skip
    runtime = Runtime(load_settings(config, db=db))
    runtime.start_ingesting()  # as `shadow ingest` does before its first batch
    pipeline = runtime.pipeline
    samples: list[Sample] = []
    events = 0
    next_sample = SAMPLE_S
    pid = os.getpid()
    cpu0, _ = footprint(pid)
    try:
        started = time.perf_counter()
        for pairs, errors in iter_file(recording.log, batch_size=10_000):
            pipeline.submit(pairs, errors)
            events += len(pairs)
            fleet_s = pairs[-1][1].ts if pairs else 0.0
            if fleet_s >= next_sample:
                next_sample += SAMPLE_S
                cpu, rss = footprint(pid)
                windows, window_end = _stored_windows(runtime)
                sample = Sample(fleet_s, time.perf_counter() - started, events,
                                pipeline.audit_lag_s, 0.0,
                                {k: v - cpu0.get(k, 0.0) for k, v in cpu.items()}, rss,
                                windows, window_end, held=_held_in(pipeline))  # fmt: skip
                samples.append(sample)
                note(sample_line("file", sample))
        pipeline.drain()
        seconds = time.perf_counter() - started
        cpu, rss = footprint(pid)
        used = {k: v - cpu0.get(k, 0.0) for k, v in cpu.items()}
        windows, window_end = _stored_windows(runtime)
        samples.append(Sample(recording.fleet_seconds, seconds, events, 0.0, 0.0, used, rss,
                              windows, window_end, held=_held_in(pipeline)))  # fmt: skip
        note(sample_line("file (drained)", samples[-1]))
        skipped = sum(state.sampler.skipped for state in pipeline.fleets.values())
    finally:
        runtime.close()
    summary = summarize_pass(samples, events, seconds, recording.required_events_per_s)
    return summary | {"audit_sampling": audit_sampling, "audit_skipped": skipped}


def _held_in(pipeline: Any) -> dict[str, int]:
    """The in-process service's held requests, as `shadow_held_requests` counts them."""
    held: Counter[str] = Counter()
    with pipeline.lock:
        for state in pipeline.fleets.values():
            held.update(state.held_requests())
    return dict(held)


def _held_served(metrics: str) -> dict[str, int]:
    """`shadow_held_requests` from a /metrics page, summed over fleets, by holder."""
    held: Counter[str] = Counter()
    for line in metrics.splitlines():
        if line.startswith("shadow_held_requests{"):
            holder = line.split('holder="', 1)[1].split('"', 1)[0]
            held[holder] += int(float(line.rsplit(" ", 1)[1]))
    return dict(held)


def _stored_windows(runtime: Runtime) -> tuple[int, float | None]:
    """How many windows the in-process service stored, and where the latest one ends."""
    row = runtime.store.query("SELECT count(*) AS n, max(t_end) AS t_end FROM windows")[0]
    return int(row["n"]), row["t_end"]


# -- pass 3: over HTTP at the fleet's pace --------------------------------------------


def _slices(log: Path, slice_s: float) -> list[tuple[float, bytes, Counter[str]]]:
    """(fleet time at the slice's end, its NDJSON body, events by kind) per `slice_s`."""
    decode = msgspec.json.Decoder(dict).decode
    out: list[tuple[float, bytes, Counter[str]]] = []
    lines: list[bytes] = []
    kinds: Counter[str] = Counter()
    end = slice_s
    with log.open("rb") as source:
        for line in source:
            event = decode(line)
            while event["ts"] > end and lines:
                out.append((end, b"".join(lines), kinds))
                lines, kinds = [], Counter()
                end += slice_s
            if event["ts"] > end:
                end = (event["ts"] // slice_s + 1) * slice_s
            lines.append(line)
            kinds[event["type"]] += 1
    if lines:
        out.append((end, b"".join(lines), kinds))
    return out


def _served_windows(client: httpx.Client, fleet: str) -> tuple[int, float | None]:
    """How many windows the service stored for `fleet`, and where the latest one ends."""
    first = client.get(f"/v1/fleets/{fleet}/windows", params={"policies": "false", "limit": 1})
    total = int(first.json()["total"])
    if not total:
        return 0, None
    last = client.get(f"/v1/fleets/{fleet}/windows",
                      params={"policies": "false", "limit": 1, "offset": total - 1})  # fmt: skip
    return total, float(last.json()["items"][0]["t_end"])


@dataclass
class _Acked:
    """What the service acknowledged, by kind, and how late the sources were."""

    by_kind: Counter[str] = field(default_factory=Counter)
    events: int = 0
    failures: int = 0
    #: per sender: how late its last POST was against the fleet's clock
    behind_s: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def ingest_http(
    recording: FleetRecording,
    db: Path,
    note: Callable[[str], None],
    slice_s: float = 0.25,
    senders: int = 4,
    audit_sampling: bool = False,
    counterfactuals: bool = False,
    max_audit_backlog: int | None = None,
    duckdb_memory_mb: int | None = None,
) -> dict:
    """`shadow serve` fed at the fleet's real-time rate: the stream cut into `slice_s` of
    fleet time, slice `i` sent by sender `i % senders` once it has happened (a fleet has
    many sources posting at once; slices stay within the reorder window of each other)."""
    config = _service_config(db, audit_sampling, counterfactuals, max_audit_backlog,
                             duckdb_memory_mb)  # fmt: skip
    slices = _slices(recording.log, slice_s)
    server = ServerProcess(db, config).start()
    acked = _Acked()
    samples: list[Sample] = []

    def sender(index: int, started: float) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for due, body, kinds in slices[index::senders]:
                wait = started + due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                behind = max(0.0, time.monotonic() - started - due)
                try:
                    response = client.post("/v1/events", content=body, headers=NDJSON)
                    ok = response.status_code == 200 and not response.json()["rejected"]
                except httpx.HTTPError:
                    ok = False
                with acked.lock:
                    acked.behind_s[index] = behind
                    if ok:
                        acked.by_kind.update(kinds)
                        acked.events += sum(kinds.values())
                    else:
                        acked.failures += 1

    try:
        pid = server.process.pid  # type: ignore[union-attr]
        cpu0, _ = footprint(pid)
        with httpx.Client(base_url=server.url, timeout=120) as client:
            started = time.monotonic()
            threads = [threading.Thread(target=sender, args=(i, started)) for i in range(senders)]
            for thread in threads:
                thread.start()
            next_sample = SAMPLE_S
            while any(thread.is_alive() for thread in threads):
                time.sleep(0.5)
                if time.monotonic() - started < next_sample:
                    continue
                metrics = client.get("/metrics").text
                lag = metric_value(metrics, "shadow_audit_lag_seconds")
                windows, window_end = _served_windows(client, FLEET)
                cpu, rss = footprint(pid)
                used = {k: v - cpu0.get(k, 0.0) for k, v in cpu.items()}
                with acked.lock:
                    events, behind = acked.events, max(acked.behind_s.values(), default=0.0)
                duck = metric_sum(metrics, "shadow_duckdb_memory_bytes") / 2**20
                sample = Sample(next_sample, time.monotonic() - started, events, lag, behind,
                                used, rss, windows, window_end, duck,
                                _held_served(metrics))  # fmt: skip
                samples.append(sample)
                note(sample_line("http", sample))
                next_sample += SAMPLE_S
            sent_s = time.monotonic() - started
            metrics = client.get("/metrics").text
            end_lag = metric_value(metrics, "shadow_audit_lag_seconds")
            skipped = metric_sum(metrics, "shadow_audit_skipped_total")
            windows, window_end = _served_windows(client, FLEET)
            cpu, rss = footprint(pid)
            used = {k: v - cpu0.get(k, 0.0) for k, v in cpu.items()}
            behind = max(acked.behind_s.values(), default=0.0)
            duck = metric_sum(metrics, "shadow_duckdb_memory_bytes") / 2**20
            samples.append(Sample(recording.fleet_seconds, sent_s, acked.events, end_lag,
                                  behind, used, rss, windows, window_end, duck,
                                  _held_served(metrics)))  # fmt: skip
            note(sample_line("http (sent)", samples[-1]))
            client.post("/v1/flush").raise_for_status()
            seconds = time.monotonic() - started
    finally:
        server.stop()
    summary = summarize_pass(samples, acked.events, sent_s, recording.required_events_per_s)
    summary |= {
        "senders": senders,
        "audit_sampling": audit_sampling,
        "max_audit_backlog": max_audit_backlog,
        "audit_skipped": skipped,
        "slice_s": slice_s,
        "behind_schedule_end_s": behind,
        "audit_lag_end_s": end_lag,
        "flushed_after_s": seconds,
        "failed_batches": acked.failures,
        "stored": _stored_check(db, acked.by_kind),
    }
    return summary


def _stored_check(db: Path, acked: Counter[str]) -> dict[str, Any]:
    """Every acknowledged event stored once: counts by kind, duplicates, progress rows."""
    with duckdb.connect(str(db), read_only=True) as con:
        held = stored_events(con)
    # progress is not an `events` row (only each request's latest is kept): its own count
    missing = held.missing(dict(acked), skip=("worker", "progress"))
    return {"stored": held.by_kind, "mismatched": missing, "duplicates": held.duplicates,
            "progress_requests": held.progress_requests, "decisions": held.decisions}  # fmt: skip


# -- the whole benchmark --------------------------------------------------------------


def run(
    shape: FleetShape,
    *,
    workdir: Path | None = None,
    http: bool = True,
    audit_sampling: bool = False,
    counterfactuals: bool = False,
    max_audit_backlog: int | None = None,
    duckdb_memory_mb: int | None = None,
    note: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Record the fleet, then the three passes, in `workdir` (kept) or a temporary one."""
    with workspace(workdir, "shadow-fleet-") as root:
        for stale in root.glob("fleet-*.duckdb*"):
            stale.unlink()
        started = time.perf_counter()
        recording = record(root, shape)
        note(f"recorded {recording.events:,} events, {recording.fleet_seconds:.0f} s of fleet "
             f"time, in {time.perf_counter() - started:.0f} s: {recording.by_kind}")  # fmt: skip
        report: dict[str, Any] = {
            "shape": asdict(shape),
            "events": recording.events,
            "by_kind": recording.by_kind,
            "fleet_seconds": recording.fleet_seconds,
            "arrival_rate_per_s": recording.arrival_rate,
            "required_events_per_s": recording.required_events_per_s,
            "counterfactuals": "on" if counterfactuals else "off",
            "duckdb_memory_mb": duckdb_memory_mb,
        }
        report["audit"] = audit_cost(recording, shape)
        note(f"audit cost: {report['audit']['audit_ms']}")
        file_db = root / "fleet-file.duckdb"
        report["file"] = ingest_file(
            recording, file_db, note, audit_sampling, counterfactuals, max_audit_backlog,
            duckdb_memory_mb,
        )  # fmt: skip
        with duckdb.connect(str(file_db)) as con:
            con.execute("CHECKPOINT")
        size = file_db.stat().st_size
        report["database_bytes"] = size
        report["gib_per_day"] = size * 86_400 / recording.fleet_seconds / 2**30
        if http:
            report["http"] = ingest_http(
                recording,
                root / "fleet-http.duckdb",
                note,
                audit_sampling=audit_sampling,
                counterfactuals=counterfactuals,
                max_audit_backlog=max_audit_backlog,
                duckdb_memory_mb=duckdb_memory_mb,
            )
        return report
