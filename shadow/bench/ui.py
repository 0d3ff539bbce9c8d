"""Page loads of the web UI with a day of 8-worker data in the database.

A day is built from real service output, not invented rows: a recorded 8-worker JSQ run
(`paper-azure2024`, load 1.0) is ingested through the service's own pipeline with the
audit, the invariants and the 30 s window replays on. Every table a page reads
(decisions, windows, window metrics and trajectories, violations) is then copied forward
in time until it covers `hours`, shifting times, window indices, ingest ids and request
ids. The raw event tables stay at the recorded length: no page reads them, and the
service re-applies them at start. Then a real Chromium opens every page and the time
from navigation to the page's `data-ready` mark is measured.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import httpx

from shadow.bench.ingest import record
from shadow.world.process import ServerProcess

PAGES = {
    "overview": "/",
    "compare": "/compare",
    "decisions": "/decisions",
    "integrity": "/integrity",
    "gate": "/gate",
    "replays": "/replays",
}
API = {
    "fleets": "/v1/fleets",
    "summary (whole day)": "/v1/fleets/default/summary",
    "compare (latest window)": "/v1/fleets/default/compare",
    "compare (last hour)": None,  # filled in with the day's end
    "decisions (page 1)": "/v1/fleets/default/decisions?limit=50&snapshot=false",
    "decisions (regret >= 500, by regret)": (
        "/v1/fleets/default/decisions?limit=50&snapshot=false&min_regret=500&sort=regret"
    ),
    "violations timeline": "/v1/fleets/default/violations/timeline",
    "windows (compare's list)": "/v1/fleets/default/windows?limit=5000&metrics=imbalance_mean",
    "windows (fidelity)": "/v1/fleets/default/windows?limit=5000&policies=false",
    "gate runs": "/v1/fleets/default/gate/runs",
    "replays": "/v1/replays",
}
TARGET_MS = 1000.0
COUNTED = ("decisions", "windows", "window_metrics", "window_trajectories", "violations",
           "events", "engine_steps")  # fmt: skip
COUNTED = ("decisions", "windows", "window_metrics", "window_trajectories", "violations",
           "events", "engine_steps")  # fmt: skip
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]  # fmt: skip


def find_chromium() -> str | None:
    """Debian's Chromium (or another Chromium-family browser on PATH); None without one."""
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


def launch_chromium(playwright: Any) -> Any:
    """Headless Chromium with the flags the benchmark and the UI tests share."""
    executable = find_chromium()
    if executable is None:
        raise RuntimeError("no Chromium on PATH: apt-get install chromium (.ci/run does)")
    return playwright.chromium.launch(executable_path=executable, headless=True,
                                      args=CHROMIUM_ARGS)  # fmt: skip


def build_day(
    db: Path, *, hours: float = 24.0, requests: int = 9000, note: Callable[[str], None] = print
) -> dict[str, Any]:
    """Ingest a recorded run into `db`, then copy its derived rows forward to `hours`."""
    from shadow.events import iter_file
    from shadow.service.runtime import Runtime
    from shadow.service.settings import load_settings

    started = time.perf_counter()
    recording = record(db.parent, requests)
    note(f"recorded {recording.events:,} events ({recording.fleet_seconds:.0f} s of fleet time)")
    settings = load_settings(None, db=db, windows=True)
    settings = settings.model_copy(update={"window_s": 30.0})
    runtime = Runtime(settings)
    try:
        for pairs, errors in iter_file(recording.log, batch_size=10_000):
            runtime.pipeline.submit(pairs, errors)
        runtime.pipeline.finish()
    finally:
        runtime.close()
    note(f"ingested with audit, invariants and windows in {time.perf_counter() - started:.0f} s")
    period = recording.fleet_seconds
    copies = max(1, math.ceil(hours * 3600.0 / period))
    con = duckdb.connect(str(db))
    con.execute("SET enable_progress_bar = false")
    try:
        shift = con.execute(
            "SELECT max(window_index) + 1, (SELECT max(ingest_id) + 1 FROM decisions) FROM windows"
        ).fetchone()
        windows_per, ids_per = int(shift[0]), int(shift[1])
        k = f"range(1, {copies}) AS c(k)"
        con.execute(
            f"INSERT INTO windows SELECT fleet, window_index + k * {windows_per}, "
            f"t_start + k * {period}, t_end + k * {period}, requests, imputed, a_ms_per_token, "
            f"b_ms, step_model_fitted, fidelity_imbalance, fidelity_step FROM windows, {k}"
        )
        for table in ("window_metrics", "window_trajectories"):
            columns = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
            select = ", ".join(
                f"window_index + k * {windows_per}" if c == "window_index" else c for c in columns
            )
            con.execute(f"INSERT INTO {table} SELECT {select} FROM {table}, {k}")
        columns = [c[0] for c in con.execute("DESCRIBE decisions").fetchall()]
        shifted = {"ingest_id": f"ingest_id + k * {ids_per}", "ts": f"ts + k * {period}",
                   "request_id": "request_id || '~' || k"}  # fmt: skip
        select = ", ".join(shifted.get(c, c) for c in columns)
        con.execute(f"INSERT INTO decisions SELECT {select} FROM decisions, {k}")
        # a realistic trickle of violations: a few per hour, of several kinds
        t0 = con.execute("SELECT min(t_start) FROM windows").fetchone()[0]
        con.execute(
            "INSERT INTO violations SELECT i, 'default', "
            "['ghost', 'engine_drift', 'finish_unknown_request', 'progress_decreased'][i % 4 + 1],"
            " 'warning', CAST(i % 8 AS VARCHAR), 'r' || i, ? + i * 600.0 + (i * 37) % 300, "
            "'synthetic benchmark row ' || i FROM range(?) AS r(i)",
            [t0, int(hours * 6)],
        )
        counts = {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in COUNTED
        }
    finally:
        con.close()
    return {"fleet_seconds_recorded": period, "copies": copies, "rows": counts,
            "database_bytes": db.stat().st_size,
            "build_s": time.perf_counter() - started}  # fmt: skip


def _gate_run(db: Path) -> None:
    """One real gate verdict on the day (the gate page needs one)."""
    from rich.console import Console

    from shadow.gate.command import gate_command

    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    gate_command(
        quiet, quiet, db=db, fleet="default", candidate="br0", baseline="jsq-pool", since=None,
        until=None, thresholds_path=None, show_thresholds=False, json_out=None,
        dry_run=True, allow_marginal=False, explain=None,
    )  # fmt: skip


def measure(db: Path, *, repeats: int = 3, note: Callable[[str], None] = print) -> dict[str, Any]:
    """Start `shadow serve` on `db`, time every page in Chromium and every API call."""
    from playwright.sync_api import sync_playwright

    config = db.parent / "bench-ui.toml"
    config.write_text("window_s = 30.0\n")
    started = time.perf_counter()
    server = ServerProcess(db, config).start(timeout=600)
    startup_s = time.perf_counter() - started
    note(f"service up in {startup_s:.1f} s")
    api: dict[str, dict[str, float]] = {}
    pages: dict[str, dict[str, float]] = {}
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            end = client.get("/v1/fleets/default/summary").json()["t_end"]
            urls = dict(API)
            urls["compare (last hour)"] = (
                f"/v1/fleets/default/compare?since={end - 3600}&until={end}"
            )
            for name, url in urls.items():
                times = []
                for _ in range(repeats + 1):
                    t = time.perf_counter()
                    response = client.get(url)
                    times.append((time.perf_counter() - t) * 1000.0)
                    response.raise_for_status()
                times = times[1:]
                api[name] = {"median_ms": statistics.median(times), "max_ms": max(times),
                             "bytes": len(response.content)}  # fmt: skip
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                for name, path in PAGES.items():
                    times = []
                    for _ in range(repeats + 1):
                        page.goto(server.url + path)
                        page.wait_for_selector(f"body[data-ready='{name}']", timeout=30_000)
                        times.append(page.evaluate("performance.now()"))
                    times = times[1:]
                    pages[name] = {"median_ms": statistics.median(times), "max_ms": max(times)}
            finally:
                browser.close()
    finally:
        server.stop()
    return {"startup_s": startup_s, "api": api, "pages": pages, "target_ms": TARGET_MS}


def run(db: Path | None, *, hours: float, repeats: int, note: Callable[[str], None]) -> dict:
    import tempfile

    if db is not None and db.exists():
        note(f"reusing {db}")
        built = {"reused": True, "database_bytes": db.stat().st_size}
        return {"build": built, **measure(db, repeats=repeats, note=note)}
    with tempfile.TemporaryDirectory() as tmp:
        path = db or Path(tmp) / "day.duckdb"
        path.parent.mkdir(parents=True, exist_ok=True)
        built = build_day(path, hours=hours, note=note)
        _gate_run(path)
        note(f"built a {hours:g} h day: {json.dumps(built['rows'])}")
        return {"build": built, **measure(path, repeats=repeats, note=note)}
