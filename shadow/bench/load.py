"""A bounded load test on loopback: sustained HTTP ingest at a fixed event rate.

The stream is a recorded 8-worker JSQ run (`paper-azure2024`) played over and over, each
pass shifted in time with fresh request ids, seqs and step numbers, so the service sees
one long, valid, ever-advancing fleet. Lines are pre-rendered as %-templates, so the
sender spends about a microsecond per event and the cores go to the server. Senders pace
batches to the target rate; the test stops by itself after `duration_s`. Afterwards the
database is opened and every acknowledged event is counted: stored exactly once.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import httpx

from shadow.bench.ingest import record
from shadow.service.process import ServerProcess

SHIFTED = ("ts", "seq", "request_id", "step")


@dataclass
class Template:
    kind: str
    line: str  # %-format with ts, seq, rid (suffix) and step offsets
    request_id: str | None


@dataclass
class Tally:
    """What the service acknowledged (a 200), by kind, and the request latencies."""

    events: dict[str, int] = field(default_factory=dict)
    progress_requests: set[str] = field(default_factory=set)
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    batches: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def templates(log: Path) -> tuple[list[Template], float, int, int]:
    """Every line of `log` as a template; also the pass length in seconds, seqs, steps."""
    out = []
    last_ts, last_seq, last_step = 0.0, 0, 0
    for raw in log.read_text().splitlines():
        event = json.loads(raw)
        last_ts = max(last_ts, event["ts"])
        last_seq = max(last_seq, event.get("seq") or 0)
        last_step = max(last_step, event.get("step", 0))
        if event["type"] == "worker":
            continue  # workers join once, in the first pass
        fields = {k: v for k, v in event.items() if k not in SHIFTED}
        text = json.dumps(fields, separators=(",", ":"))[:-1].replace("%", "%%")
        text += ',"ts":%(ts_' + repr(event["ts"]) + ')s,"seq":%(seq_' + str(event["seq"]) + ")s"
        if "request_id" in event:
            text += ',"request_id":"' + event["request_id"] + '%(pass)s"'
        if "step" in event:
            text += ',"step":%(step_' + str(event["step"]) + ")s"
        out.append(Template(event["type"], text + "}\n", event.get("request_id")))
    return out, last_ts + 1.0, last_seq, last_step + 1


class _Shifted(dict):
    """`%(ts_1.5)s` -> the shifted value: per pass, the offsets are all a template needs."""

    def __init__(self, k: int, period: float, seqs: int, steps: int) -> None:
        super().__init__()
        self.k, self.period, self.seqs, self.steps = k, period, seqs, steps

    def __missing__(self, key: str) -> str:
        name, _, value = key.partition("_")
        if key == "pass":
            return f"~{self.k}"
        if name == "ts":
            return repr(float(value) + self.k * self.period)
        if name == "seq":
            return str(int(value) + self.k * self.seqs)
        return str(int(value) + self.k * self.steps)


def _rss_kib(pid: int) -> int:
    """Resident memory of `pid` and all its descendants (the audit worker among them)."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending += [int(c) for c in children.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _commit_counters(metrics: str) -> dict[str, float]:
    """Group-commit counters from the service's /metrics text."""
    out = {"transactions": 0.0, "batches": 0.0}
    for line in metrics.splitlines():
        for name in out:
            if line.startswith(f"shadow_commit_{name}_total "):
                out[name] = float(line.split()[1])
    return out


def run(
    *,
    rate: float = 40_000.0,
    duration_s: float = 300.0,
    batch: int = 2000,
    senders: int = 2,
    requests: int = 10_000,
    workdir: Path | None = None,
    note=print,
) -> dict[str, Any]:
    import tempfile

    root = Path(workdir or tempfile.mkdtemp(prefix="shadow-load-"))
    root.mkdir(parents=True, exist_ok=True)
    recording = record(root, requests)
    lines, period, seqs, steps = templates(recording.log)
    workers = [raw for raw in recording.log.read_text().splitlines() if '"worker"' in raw[:20]]
    note(f"template: {len(lines):,} events per pass, {period:.0f} s of fleet time")
    db = root / "load.duckdb"
    for stale in root.glob("load.duckdb*"):
        stale.unlink()
    config = root / "load.toml"
    config.write_text("windows = false\n")
    server = ServerProcess(db, config).start()
    tally = Tally()
    stop_at = time.monotonic() + duration_s
    rss: list[tuple[float, int]] = []
    cursor = {"k": 0, "i": 0}
    cursor_lock = threading.Lock()

    def next_batch() -> tuple[bytes, dict[str, int], set[str]]:
        with cursor_lock:
            k, i = cursor["k"], cursor["i"]
            end = min(i + batch, len(lines))
            cursor["k"], cursor["i"] = (k + 1, 0) if end == len(lines) else (k, end)
        values = _Shifted(k, period, seqs, steps)
        chunk = lines[i:end]
        counts: dict[str, int] = {}
        progress: set[str] = set()
        for t in chunk:
            counts[t.kind] = counts.get(t.kind, 0) + 1
            if t.kind == "progress":
                progress.add(f"{t.request_id}~{k}")
        return "".join(t.line % values for t in chunk).encode(), counts, progress

    def sender(index: int) -> None:
        interval = batch * senders / rate
        due = time.monotonic() + index * batch / rate
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while True:
                now = time.monotonic()
                if now >= stop_at:
                    return
                if now < due:
                    time.sleep(due - now)
                due += interval
                body, counts, progress = next_batch()
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
                    tally.latencies_ms.append(elapsed)
                    if not ok:
                        tally.failures += 1
                        continue
                    for kind, n in counts.items():
                        tally.events[kind] = tally.events.get(kind, 0) + n
                    tally.progress_requests |= progress

    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            client.post("/v1/events", content="\n".join(workers)).raise_for_status()
        started = time.monotonic()
        threads = [threading.Thread(target=sender, args=(i,)) for i in range(senders)]
        for thread in threads:
            thread.start()
        last_note = started
        while any(thread.is_alive() for thread in threads):
            time.sleep(1.0)
            now = time.monotonic()
            rss.append((now - started, _rss_kib(server.process.pid)))
            if now - last_note >= 30:
                last_note = now
                sent = sum(tally.events.values())
                pace = sent / (now - started)
                note(f"{now - started:5.0f} s: {sent:,} events acknowledged ({pace:,.0f}/s), "
                     f"RSS {rss[-1][1] / 1024:,.0f} MiB")  # fmt: skip
        wall = time.monotonic() - started
        with httpx.Client(base_url=server.url, timeout=120) as client:
            client.post("/v1/flush").raise_for_status()
            commits = _commit_counters(client.get("/metrics").text)
    finally:
        server.stop()
    con = duckdb.connect(str(db), read_only=True)
    try:
        stored = {
            kind: n
            for kind, n in con.execute(
                "SELECT type, count(*) FROM events WHERE type <> 'worker' GROUP BY type"
            ).fetchall()
        }
        stored["engine_step"] = con.execute("SELECT count(*) FROM engine_steps").fetchone()[0]
        duplicates = con.execute(
            "SELECT (SELECT count(*) FROM events) - (SELECT count(DISTINCT (source, seq)) "
            "FROM events) + (SELECT count(*) FROM engine_steps) - (SELECT count(DISTINCT "
            "(source, seq)) FROM engine_steps)"
        ).fetchone()[0]
        progress_rows = con.execute("SELECT count(*) FROM progress_latest").fetchone()[0]
        decisions = con.execute("SELECT count(*) FROM decisions").fetchone()[0]
    finally:
        con.close()
    acked = dict(tally.events)
    acked_progress = acked.pop("progress", 0)
    lost = {k: acked[k] - stored.get(k, 0) for k in acked if acked[k] > stored.get(k, 0)}
    latencies = sorted(tally.latencies_ms)
    warm = [kib for t, kib in rss if t >= 60.0] or [kib for _, kib in rss]
    total = sum(tally.events.values())
    return {
        "target_events_per_s": rate,
        "duration_s": wall,
        "batch": batch,
        "senders": senders,
        "events_acknowledged": total,
        "events_per_s": total / wall,
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
        "duplicates": int(duplicates),
        "progress": {
            "acknowledged_events": acked_progress,
            "requests": len(tally.progress_requests),
            "stored_latest_rows": int(progress_rows),
        },
        "decisions_audited": int(decisions),
        "commits": {
            "transactions": commits["transactions"],
            "batches": commits["batches"],
            "batches_per_transaction": commits["batches"] / max(1, commits["transactions"]),
        },
        "rss_mib": {
            "after_warmup": warm[0] / 1024 if warm else None,
            "end": rss[-1][1] / 1024 if rss else None,
            "max_after_warmup": max(warm) / 1024 if warm else None,
        },
        "rss_series": [(round(t, 1), kib) for t, kib in rss[:: max(1, len(rss) // 60)]],
    }
