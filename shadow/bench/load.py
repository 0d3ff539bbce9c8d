"""A bounded load test on loopback: sustained HTTP ingest at a fixed event rate.

The stream is a recorded 8-worker JSQ run (`paper-azure2024`) played over and over, each
pass shifted in time with fresh request ids, seqs and step numbers. Each sender streams a
fleet of its own, in order, so the service sees that many long, valid, ever-advancing
fleets. Batches are pre-rendered templates (two `bytes.replace` a batch, see
`BatchTemplate`), so the cores go to the server. Senders pace
batches to the target rate; the test stops by itself after `duration_s`. Afterwards the
database is opened and every acknowledged event is counted: stored exactly once.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import httpx
import numpy as np

from shadow.bench.ingest import record
from shadow.bench.scrape import metric_sum, metric_value
from shadow.bench.stored import stored_events
from shadow.bench.workspace import workspace
from shadow.service.footprint import cpu_seconds, process_tree, resident_bytes
from shadow.world.process import ServerProcess

SHIFTED = ("ts", "seq", "request_id", "step")
PASS = b"\x00"  # where a batch template takes the pass number
FLEET = b"\x01"  # where it takes the sender's fleet number
#: memory is judged after this: start-up, the first passes, DuckDB's pool filling
WARM_UP_S = 60.0
#: seconds between progress lines, each with the interval's rate and CPU per event
INTERVAL_S = 30.0


@dataclass(frozen=True)
class BatchTemplate:
    """One batch of a pass, with `PASS` where the pass number goes and `FLEET` where the
    sender's goes: rendering is a `bytes.replace` for each, so the load generator spends
    nanoseconds per event and the cores go to the server."""

    body: bytes
    counts: dict[str, int]
    progress_requests: frozenset[str]


@dataclass
class Tally:
    """What the service acknowledged (a 200), by kind, and the request latencies."""

    events: dict[str, int] = field(default_factory=dict)
    #: (fleet, pass, batch index) of every acknowledged batch
    batches_acked: list[tuple[int, int, int]] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    batches: int = 0
    #: events of the batches due before the load stopped (what the schedule offered)
    offered: int = 0
    #: events acknowledged before the load stopped (the sustained rate's numerator)
    in_window: int = 0
    #: per sender: how late its last batch was sent against its schedule, and the most
    behind_s: dict[int, float] = field(default_factory=dict)
    max_behind_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _digits(value: float) -> int:
    return len(str(int(value)))


def batch_templates(log: Path, batch: int) -> tuple[list[BatchTemplate], bytes]:
    """The recorded log cut into batch templates, and its worker events (they join once,
    before the first pass) as one NDJSON body.

    Pass k (from 1) shifts by prefixing k to the zero-padded numbers: ts becomes
    k * 10^d + ts with 10^d longer than the recording, seqs and steps likewise, and
    request ids get a `~k` suffix, so every pass is a new, later stretch of the same
    fleet (with an idle gap between passes). The fleet's name ends in `FLEET`, so each
    sender streams a fleet of its own.
    """
    events = [json.loads(raw) for raw in log.read_text().splitlines()]
    width_ts = _digits(max(e["ts"] for e in events))
    width_seq = _digits(max(e.get("seq") or 0 for e in events))
    width_step = _digits(max(e.get("step", 0) for e in events))
    lines: list[tuple[str, bytes, str | None]] = []
    shift = PASS.decode()

    def own_fleet(event: dict) -> str:
        """`event` as JSON without its closing brace, its fleet name ending in FLEET."""
        fields = {k: v for k, v in event.items() if k != "fleet"}
        fleet = json.dumps(event["fleet"] + "-")[:-1] + FLEET.decode() + '"'
        return json.dumps(fields, separators=(",", ":"))[:-1] + f',"fleet":{fleet}'

    workers = [own_fleet(event) + "}" for event in events if event["type"] == "worker"]
    for event in events:
        if event["type"] == "worker":
            continue
        text = own_fleet({k: v for k, v in event.items() if k not in SHIFTED})
        text += (
            f',"ts":{shift}{event["ts"]:0{width_ts + 10}.9f}'
            f',"seq":{shift}{event["seq"]:0{width_seq}d}'
        )
        if "request_id" in event:
            text += ',"request_id":' + json.dumps(event["request_id"] + "~")[:-1] + shift + '"'
        if "step" in event:
            text += f',"step":{shift}{event["step"]:0{width_step}d}'
        lines.append((event["type"], (text + "}\n").encode(), event.get("request_id")))
    out = []
    for start in range(0, len(lines), batch):
        chunk = lines[start : start + batch]
        counts: dict[str, int] = {}
        for kind, _, _ in chunk:
            counts[kind] = counts.get(kind, 0) + 1
        progress = frozenset(rid for kind, _, rid in chunk if kind == "progress" and rid)
        out.append(BatchTemplate(b"".join(line for _, line, _ in chunk), counts, progress))
    return out, "\n".join(workers).encode()


def _server_and_workers(pid: int, read: Callable[[int], float | None]) -> tuple[float, float]:
    """`read` of `pid` and summed over its descendants (the worker processes); a process
    gone meanwhile counts 0."""
    server = read(pid) or 0
    workers = sum(read(p) or 0 for p in process_tree(pid) if p != pid)
    return server, workers


def _rss_kib(pid: int) -> tuple[int, int]:
    """Resident memory of `pid` and of all its descendants (the audit worker), KiB."""
    server, workers = _server_and_workers(pid, resident_bytes)
    return int(server) // 1024, int(workers) // 1024


class Mark(NamedTuple):
    """The counters at one moment of the run; two of them make an `Interval`."""

    seconds: float  # since the load started
    acknowledged: int
    server_cpu_s: float
    workers_cpu_s: float


@dataclass
class Interval:
    """One stretch of the run: what was acknowledged and the CPU it took the server and
    its worker processes. The audit worker's work per event is fixed by the stream, so its
    CPU per event rising with the server's points at the host or at the two processes
    contending for the cores and caches, not at the server's own code."""

    start_s: float
    end_s: float
    events_per_s: float
    server_cpu_us_per_event: float | None
    workers_cpu_us_per_event: float | None

    def line(self) -> str:
        def us(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        return (f"{self.end_s:5.0f} s: {self.events_per_s:,.0f} events/s; CPU per event: "
                f"server {us(self.server_cpu_us_per_event)} us, workers "
                f"{us(self.workers_cpu_us_per_event)} us")  # fmt: skip


def growth_mib_per_min(series: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) samples, in MiB a minute: flat is ~0."""
    if len(series) < 2:
        return None
    seconds, mib = np.array(series, dtype=np.float64).T
    if np.ptp(seconds) == 0:
        return None
    return float(np.polyfit(seconds, mib, 1)[0] * 60.0)


def _progress_requests(templates: list[BatchTemplate], acked: list[tuple[int, int, int]]) -> int:
    """Distinct requests with an acknowledged progress event (a request id per fleet and
    pass)."""
    by_pass: dict[tuple[int, int], set[str]] = {}
    for fleet, k, i in acked:
        by_pass.setdefault((fleet, k), set()).update(templates[i].progress_requests)
    return sum(len(requests) for requests in by_pass.values())


def _commit_counters(metrics: str) -> dict[str, float]:
    """Group-commit counters from the service's /metrics text."""
    return {
        name: metric_value(metrics, f"shadow_commit_{name}_total")
        for name in ("transactions", "batches", "seconds")
    }


def run(
    *,
    rate: float = 40_000.0,
    duration_s: float = 300.0,
    batch: int = 2000,
    senders: int = 16,
    requests: int = 10_000,
    duckdb_memory_mb: int | None = 64,
    workdir: Path | None = None,
    interval_s: float = INTERVAL_S,
    counterfactuals: bool = False,
    note=print,
) -> dict[str, Any]:
    """Run the load test in `workdir` (kept), or in a temporary folder (see `workspace`).
    `counterfactuals`: the windows on (continuous counterfactuals for every fleet, in the
    window worker), to show ingest keeps its rate beside them."""
    with workspace(workdir, "shadow-load-") as root:
        return _run_in(root, rate=rate, duration_s=duration_s, batch=batch, senders=senders,
                       requests=requests, duckdb_memory_mb=duckdb_memory_mb,
                       interval_s=interval_s, counterfactuals=counterfactuals,
                       note=note)  # fmt: skip


def _run_in(
    root: Path,
    *,
    rate: float,
    duration_s: float,
    batch: int,
    senders: int,
    requests: int,
    duckdb_memory_mb: int | None,
    interval_s: float,
    counterfactuals: bool,
    note,
) -> dict[str, Any]:
    recording = record(root, requests)
    templates, workers = batch_templates(recording.log, batch)
    per_pass = sum(sum(t.counts.values()) for t in templates)
    note(f"template: {per_pass:,} events per pass in {len(templates):,} batches of {batch:,}, "
         f"{recording.fleet_seconds:.0f} s of fleet time")  # fmt: skip
    db = root / "load.duckdb"
    for stale in root.glob("load.duckdb*"):
        stale.unlink()
    config = root / "load.toml"
    settings = "windows = true\n" if counterfactuals else "windows = false\n"
    if duckdb_memory_mb is not None:
        settings += f"duckdb_memory_mb = {int(duckdb_memory_mb)}\n"
    config.write_text(settings)
    server = ServerProcess(db, config).start()
    tally = Tally()
    stop_at = time.monotonic() + duration_s
    #: (seconds, server KiB, worker processes KiB)
    rss: list[tuple[float, int, int]] = []
    intervals: list[Interval] = []

    def sender(index: int) -> None:
        """Streams fleet `index` in order, pass after pass, at its share of the rate: a
        source's events arrive in order, and sources run concurrently (batches of one
        fleet sent by different clients would arrive out of order by far more than the
        reorder window, the recording running ~150x faster than real time)."""
        interval = batch * senders / rate
        due = time.monotonic() + index * batch / rate
        fleet = str(index).encode()
        k, i = 1, 0
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while True:
                now = time.monotonic()
                if now >= stop_at:
                    return
                if now < due:
                    time.sleep(due - now)
                behind = max(0.0, now - due)  # a sender falls behind when responses lag
                due += interval
                body = templates[i].body.replace(PASS, str(k).encode()).replace(FLEET, fleet)
                size = sum(templates[i].counts.values())
                started = time.perf_counter()
                try:
                    response = client.post(
                        "/v1/events", content=body,
                        headers={"content-type": "application/x-ndjson"},
                    )  # fmt: skip
                    ok = response.status_code == 200 and not response.json()["rejected"]
                except httpx.HTTPError:
                    ok = False
                elapsed = (time.perf_counter() - started) * 1000.0
                with tally.lock:
                    tally.batches += 1
                    tally.offered += size
                    tally.behind_s[index] = behind
                    tally.max_behind_s = max(tally.max_behind_s, behind)
                    tally.latencies_ms.append(elapsed)
                    if ok:
                        if time.monotonic() <= stop_at:
                            tally.in_window += size
                        for kind, n in templates[i].counts.items():
                            tally.events[kind] = tally.events.get(kind, 0) + n
                        tally.batches_acked.append((index, k, i))
                    else:
                        tally.failures += 1
                k, i = (k + 1, 0) if i + 1 == len(templates) else (k, i + 1)

    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for index in range(senders):
                fleet_workers = workers.replace(FLEET, str(index).encode())
                client.post("/v1/events", content=fleet_workers).raise_for_status()
        started = time.monotonic()
        threads = [threading.Thread(target=sender, args=(i,)) for i in range(senders)]
        for thread in threads:
            thread.start()
        #: the counters at the start of the interval; each interval's end is the next
        #: one's start
        mark = _mark(started, tally, server)
        while any(thread.is_alive() for thread in threads):
            time.sleep(1.0)
            now = time.monotonic()
            rss.append((now - started, *_rss_kib(server.process.pid)))
            if now - started - mark.seconds >= interval_s:
                end = _mark(started, tally, server)
                intervals.append(_interval(mark, end))
                note(f"{intervals[-1].line()}; {end.acknowledged:,} acknowledged, RSS "
                     f"{(rss[-1][1] + rss[-1][2]) / 1024:,.0f} MiB")  # fmt: skip
                mark = end
        wall = time.monotonic() - started
        window = stop_at - started
        with httpx.Client(base_url=server.url, timeout=120) as client:
            # the derived work as the load stopped, before the flush lets it catch up
            at_end = client.get("/metrics").text
            audit_at_end = {
                "lag_s": metric_value(at_end, "shadow_audit_lag_seconds"),
                "backlog_batches": metric_value(at_end, "shadow_audit_backlog_batches"),
                "skipped": int(metric_sum(at_end, "shadow_audit_skipped_total")),
            }
            client.post("/v1/flush").raise_for_status()
            commits = _commit_counters(client.get("/metrics").text)
    finally:
        server.stop()
    con = duckdb.connect(str(db), read_only=True)
    try:
        held = stored_events(con)
        violations = dict(
            con.execute("SELECT kind, count(*) FROM violations GROUP BY kind").fetchall()
        )
        windows = con.execute("SELECT count(*), count(DISTINCT fleet) FROM windows").fetchone()
    finally:
        con.close()
    acked = dict(tally.events)
    acked_progress = acked.pop("progress", 0)
    stored = held.by_kind
    lost = {kind: n for kind, n in held.missing(acked).items() if n > 0}
    latencies = sorted(tally.latencies_ms)
    warm = [sample for sample in rss if sample[0] >= WARM_UP_S] or rss
    settled = [i for i in intervals if i.start_s >= WARM_UP_S] or intervals
    total_mib = [(t, (server + workers) / 1024) for t, server, workers in warm]
    total = sum(tally.events.values())
    return {
        "target_events_per_s": rate,
        "duration_s": wall,
        "batch": batch,
        "senders": senders,
        "events_acknowledged": total,
        #: everything acknowledged over the whole run, the last responses included
        "events_per_s": total / wall,
        #: acknowledged while the load ran, over that time: a server that keeps pace
        #: acknowledges what the schedule offered, less its last batches
        "sustained_events_per_s": tally.in_window / window,
        "events_offered": tally.offered,
        #: how late the senders were against their schedule: at their last batch (near 0
        #: when the service kept pace to the end) and at worst
        "behind_schedule_s": {
            "end": max(tally.behind_s.values(), default=0.0),
            "max": tally.max_behind_s,
        },
        "batches": tally.batches,
        "failed_batches": tally.failures,
        "latency_ms": {
            "p50": statistics.median(latencies) if latencies else None,
            "p99": latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
            "max": latencies[-1] if latencies else None,
        },
        "stored": stored,
        "acknowledged": acked,
        "lost": lost,
        "duplicates": held.duplicates,
        "progress": {
            "acknowledged_events": acked_progress,
            "requests": _progress_requests(templates, tally.batches_acked),
            "stored_latest_rows": held.progress_requests,
        },
        "decisions_audited": held.decisions,
        #: the audit when the load stopped: how far behind (fleet seconds), its queue,
        #: and the dispatches its sampling skipped (0: every dispatch audited)
        "audit_at_load_end": audit_at_end,
        "counterfactuals": counterfactuals,
        #: windows the continuous counterfactuals evaluated, and over how many fleets
        "windows_evaluated": {"windows": int(windows[0]), "fleets": int(windows[1])},
        #: a clean recorded stream raises none: any here are the load's own artefacts
        "violations": violations,
        "commits": {
            "transactions": commits["transactions"],
            "batches": commits["batches"],
            "batches_per_transaction": commits["batches"] / max(1, commits["transactions"]),
            "busy_fraction": commits["seconds"] / wall,
        },
        "rss_mib": {
            "after_warmup": total_mib[0][1] if total_mib else None,
            "end": total_mib[-1][1] if total_mib else None,
            "max_after_warmup": max(mib for _, mib in total_mib) if total_mib else None,
            "growth_mib_per_min": growth_mib_per_min(total_mib),
            "server_growth_mib_per_min": growth_mib_per_min(
                [(t, server / 1024) for t, server, _ in warm]
            ),
            "workers_growth_mib_per_min": growth_mib_per_min(
                [(t, workers / 1024) for t, _, workers in warm]
            ),
        },
        #: (seconds, server KiB, worker processes KiB)
        "rss_series": rss[:: max(1, len(rss) // 60)],
        #: per interval (30 s): the rate acknowledged and the CPU per event
        "intervals": [asdict(interval) for interval in intervals],
        #: over the intervals after the warm-up (all of them in a run shorter than it)
        "server_cpu_us_per_event": _spread([i.server_cpu_us_per_event for i in settled]),
        "workers_cpu_us_per_event": _spread([i.workers_cpu_us_per_event for i in settled]),
    }


def _mark(started: float, tally: Tally, server: ServerProcess) -> Mark:
    """The counters now."""
    seconds = time.monotonic() - started
    return Mark(
        seconds,
        sum(tally.events.values()),
        *_server_and_workers(server.process.pid, cpu_seconds),
    )


def _interval(start: Mark, end: Mark) -> Interval:
    """The interval between two marks. CPU per event is None without events, or when a
    process went away meanwhile (its CPU time then reads lower than before)."""
    events = end.acknowledged - start.acknowledged
    server_s = end.server_cpu_s - start.server_cpu_s
    workers_s = end.workers_cpu_s - start.workers_cpu_s
    return Interval(
        start_s=start.seconds,
        end_s=end.seconds,
        events_per_s=events / (end.seconds - start.seconds),
        server_cpu_us_per_event=server_s / events * 1e6 if events and server_s >= 0 else None,
        workers_cpu_us_per_event=workers_s / events * 1e6 if events and workers_s >= 0 else None,
    )


def _spread(values: list[float | None]) -> dict[str, float] | None:
    """Min, median and max of the intervals' values (None without any)."""
    present = [value for value in values if value is not None]
    if not present:
        return None
    return {"min": min(present), "median": statistics.median(present), "max": max(present)}
