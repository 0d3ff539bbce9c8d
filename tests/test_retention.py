"""Retention to Parquet (`shadow.storage.archive`): a run on a database holding two days
moves the older one out of DuckDB while ingest goes on, and the API and the gate answer
the same for that day; a crash at any point of a chunk loses and doubles nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import httpx
import pytest
from service_helpers import Server, post, record, write_config

from shadow.service.store import ServiceStore
from shadow.storage import queries
from shadow.storage.archive import (
    TABLE_NAMES,
    ArchivedTable,
    ArchiveMismatch,
    archive_before,
    archive_root,
    day_start,
    retention_cutoff,
)
from shadow.storage.database import duck_connection

REPO = Path(__file__).resolve().parents[1]
#: the older day ends two minutes before midnight, the newer one starts just after it
DAY_A = datetime(2026, 11, 1, tzinfo=UTC).date()
DAY_B = datetime(2026, 11, 2, tzinfo=UTC).date()
A_START = day_start(DAY_B) - 200.0
B_START = day_start(DAY_B) + 60.0
BATCH_LINES = 1000
FEED_EVENTS_S = 10_000


def _retimed(path: Path, offset: float, prefix: str, seq_from: int, step_from: int) -> list[str]:
    """A recorded log moved to `offset` seconds: request ids prefixed, seqs and engine
    steps continuing from the day before (a restarted numbering would be duplicates);
    worker announcements only on the first day."""
    out = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if prefix and event["type"] == "worker":
            continue
        event["ts"] = event["ts"] + offset
        event["seq"] = event["seq"] + seq_from
        if "request_id" in event:
            event["request_id"] = prefix + event["request_id"]
        if event["type"] == "engine_step":
            event["step"] = event["step"] + step_from
        out.append(json.dumps(event))
    return out


def _with_anomalies(lines: list[str]) -> list[str]:
    """The older day with violations in it, none of which leaves a request unfinished (a
    window waits for its requests): a running request dispatched again (critical), a
    dispatch of a request never ready, and a finish of a request never dispatched."""
    events = [json.loads(line) for line in lines]
    seq = max(e["seq"] for e in events)
    at = next(i for i, e in enumerate(events) if e["type"] == "dispatch" and i > len(events) // 2)
    again = {**events[at], "seq": seq + 1}
    last = events[-1]["ts"]
    extra = [
        {"type": "dispatch", "request_id": "never-ready", "worker": 1, "policy": "jsq"},
        {"type": "finish", "request_id": "never-ready", "output_tokens": 3, "reason": "stop"},
        {"type": "finish", "request_id": "never-dispatched", "output_tokens": 3,
         "reason": "stop"},
    ]  # fmt: skip
    tail = [{**e, "ts": last + 0.5 + 0.1 * i, "fleet": "default", "seq": seq + 2 + i}
            for i, e in enumerate(extra)]  # fmt: skip
    out = [*events[: at + 1], again, *events[at + 1 :], *tail]
    return [json.dumps(e) for e in out]


def _bodies(lines: list[str]) -> list[bytes]:
    return [
        ("\n".join(lines[i : i + BATCH_LINES]) + "\n").encode()
        for i in range(0, len(lines), BATCH_LINES)
    ]


def _settle(client: httpx.Client, url: str) -> None:
    """Flush until the window replays stop coming (they run in a worker process)."""
    seen, stable = -1, 0
    while stable < 5:
        evaluated = client.post(f"{url}/v1/flush").json()["windows_evaluated"]
        stable = stable + 1 if evaluated == seen else 0
        seen = evaluated
        time.sleep(0.3)


def _all_pages(client: httpx.Client, url: str, params: dict) -> dict:
    items, offset = [], 0
    while True:
        page = client.get(url, params={**params, "limit": 1000, "offset": offset}).json()
        items += page["items"]
        offset += 1000
        if offset >= page["total"]:
            return {"total": page["total"], "items": items}


def _answers(client: httpx.Client, url: str, since: float, until: float) -> dict:
    """What the API and the gate say of `[since, until)`."""
    fleet = f"{url}/v1/fleets/default"
    span = {"since": since, "until": until}
    gate = client.post(
        f"{fleet}/gate/dry-run", json={"candidate": "br0", "baseline": "jsq", **span}
    ).json()
    for volatile in ("id", "ts"):
        gate.pop(volatile)
    violations = _all_pages(client, f"{fleet}/violations", span)
    violations["items"].sort(key=lambda v: (v["ingest_id"], v["kind"]))  # ties in ts order
    return {
        "summary": client.get(f"{fleet}/summary", params=span).json(),
        "decisions": _all_pages(client, f"{fleet}/decisions", {**span, "sort": "ts"}),
        "violations": violations,
        "gate": gate,
    }


def test_retention_moves_the_older_day_while_ingest_goes_on(tmp_path):
    recorded_a, recorded_b = tmp_path / "a.ndjson", tmp_path / "b.ndjson"
    record(recorded_a, requests=1200, seed=1)
    record(recorded_b, requests=1200, seed=2)
    day_a = _with_anomalies(_retimed(recorded_a, A_START - 100.0, "", 0, 0))
    steps = max(json.loads(x).get("step", 0) for x in day_a) + 1
    day_b = _retimed(recorded_b, B_START, "b-", len(day_a) + 10, steps)
    assert datetime.fromtimestamp(json.loads(day_a[-1])["ts"], UTC).date() == DAY_A
    assert datetime.fromtimestamp(json.loads(day_a[0])["ts"], UTC).date() == DAY_A
    db = tmp_path / "shadow.duckdb"
    config = write_config(tmp_path / "shadow.toml")
    config.write_text("[storage]\nchunk_rows = 2000\n")
    server = Server(db, config).start()
    a_range = (day_start(DAY_A), day_start(DAY_B))
    bodies_b = _bodies(day_b)
    # the older day's last window runs into the newer day's first requests: "before" waits
    # for them to finish and that window to be replayed
    lead = len(bodies_b) // 2
    waits: list[tuple[float, float]] = []  # (started, seconds) of each batch during the run
    try:
        with httpx.Client(timeout=60) as client:
            for body in _bodies(day_a) + bodies_b[:lead]:
                post(client, server.url, body)
            _settle(client, server.url)
            before = _answers(client, server.url, *a_range)
            assert before["decisions"]["total"] > 3000 and before["violations"]["total"] >= 3
            assert before["gate"]["evidence"]["critical_violations"] >= 1

            def ingest() -> None:  # at a fleet's pace: 10,000 events/s
                with httpx.Client(timeout=60) as feeder:
                    due = time.perf_counter()
                    for body in bodies_b[lead:]:
                        time.sleep(max(0.0, due - time.perf_counter()))
                        started = time.perf_counter()
                        post(feeder, server.url, body)
                        waits.append((started, time.perf_counter() - started))
                        due += BATCH_LINES / FEED_EVENTS_S

            feeder = threading.Thread(target=ingest)
            feeder.start()
            time.sleep(0.3)  # ingest is under way
            run_start = time.perf_counter()
            moved = client.post(
                f"{server.url}/v1/storage/archive", json={"before": DAY_B.isoformat()}
            )
            run_end = time.perf_counter()
            feeder.join()
            assert moved.status_code == 200, moved.text
            result = moved.json()
            _settle(client, server.url)
            after = _answers(client, server.url, *a_range)
            metrics = client.get(f"{server.url}/metrics").text
    finally:
        server.stop()

    # after a restart, the archived day's events sent again are duplicates (their seqs
    # are remembered, not their rows), and the day still answers the same
    server = Server(db, config).start()
    try:
        with httpx.Client(timeout=60) as client:
            resent = post(client, server.url, _bodies(day_a)[1])
            assert resent["accepted"] == 0 and resent["duplicates"] == BATCH_LINES
            _settle(client, server.url)
            restarted = _answers(client, server.url, *a_range)
    finally:
        server.stop()
    for key in before:
        assert restarted[key] == before[key], key

    during = [seconds for started, seconds in waits if run_start <= started <= run_end]
    print(
        f"archived {result['rows']} rows in {result['files']} files, {run_end - run_start:.2f} s; "
        f"{len(during)} batches posted during the run, slowest {max(during):.3f} s; "
        f"longest writer hold {result['max_commit_s'] * 1000:.1f} ms"
    )
    assert len(during) >= 3, "ingest did not go on during the run"
    assert max(during) < 1.0 and max(s for _, s in waits) < 1.0
    assert result["max_commit_s"] < 1.0
    assert result["days"] == [DAY_A.isoformat()]
    for key in before:
        assert after[key] == before[key], key

    # the older day is out of DuckDB (but its worker announcements), the newer day is not
    live = duckdb.connect(str(db), read_only=True)
    for table in TABLE_NAMES:
        left = live.execute(
            f"SELECT count(*) FROM {table} WHERE ts < ? "
            + ("AND type <> 'worker'" if table == "events" else ""),
            [a_range[1]],
        ).fetchone()[0]
        assert left == 0, table
    assert live.execute("SELECT count(*) FROM events WHERE ts >= ?", [B_START]).fetchone()[0] > 0
    listed = live.execute("SELECT sum(rows), sum(bytes) FROM archive_files").fetchone()
    live.close()
    assert result["rows"]["decisions"] == before["decisions"]["total"]
    assert result["rows"]["violations"] == before["violations"]["total"]

    # the archive is plain hive-partitioned Parquet: readable as it is
    root = archive_root(db)
    outside = duckdb.sql(
        f"SELECT date, count(*) FROM read_parquet('{root}/table=decisions/*/*.parquet', "
        "hive_partitioning = true) GROUP BY date"
    ).fetchall()
    assert outside == [(DAY_A, before["decisions"]["total"])]
    assert (
        f'shadow_archived_rows_total{{table="decisions"}} {float(result["rows"]["decisions"])}'
        in metrics
    )
    assert sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("shadow_archived_bytes_total{")) == listed[1]  # fmt: skip


# -- crash safety: a chunk is written, renamed, then deleted and listed in one transaction --

ROWS = 5000


def _two_days(path: Path) -> ServiceStore:
    """A database with `ROWS` events and violations on each of two days (every 100th
    event a worker announcement, which stays live) and engine samples on the first."""
    store = ServiceStore(path)
    start = day_start(DAY_A)
    with store.engine.begin() as conn:
        duck = duck_connection(conn)
        duck.execute(
            "INSERT INTO events (ingest_id, fleet, source, type, ts, request_id, worker) "
            "SELECT i, 'default', 's', CASE WHEN i % 100 = 0 THEN 'worker' ELSE 'ready' END, "
            f"{start} + i * 86400.0 / {ROWS}, 'r' || i, 'w0' FROM range({2 * ROWS}) t(i)"
        )
        duck.execute(
            "INSERT INTO violations SELECT i, 'default', 'ghost', 'warning', 'w0', 'r' || i, "
            f"{start} + i * 86400.0 / {ROWS}, 'x' FROM range({2 * ROWS}) t(i)"
        )
        duck.execute(
            "INSERT INTO engine_samples SELECT 'default', 'w0', "
            f"{start} + i * 10.0, 1, 0, 0.5, i, 1 FROM range({ROWS}) t(i)"
        )
    return store


def _through_union(store: ServiceStore, table: str) -> tuple[int, int]:
    """Rows of `table` as the service reads them (live and listed files), and distinct."""
    key = "ts" if table == "engine_samples" else "ingest_id"
    found = store.query(
        f"SELECT count(*) AS n, count(DISTINCT {key}) AS d FROM {queries.source(store, table)}"
    )[0]
    return int(found["n"]), int(found["d"])


def _on_disk(root: Path, table: str) -> int:
    files = list((root / f"table={table}").glob("date=*/*.parquet"))
    if not files:
        return 0
    listed = ", ".join(f"'{f}'" for f in files)
    return duckdb.sql(f"SELECT count(*) FROM read_parquet([{listed}])").fetchall()[0][0]


def _crash_in_a_run(db: Path, when: str) -> None:
    """Run an archive of the first day in a child process that dies (`os._exit`, no
    clean-up) at `when`: "before-delete" (the first file durable, its rows not deleted)
    or "after-commit" (the first chunk's delete and listing committed)."""
    crash = {
        "before-delete": "lambda work: os._exit(9)",
        "after-commit": "lambda work: (work(), os._exit(9))",
    }[when]
    code = (
        "import os; from pathlib import Path\n"
        "from shadow.service.store import ServiceStore\n"
        "from shadow.storage.archive import archive_before, archive_root, day_start\n"
        "from datetime import date\n"
        f"store = ServiceStore({str(db)!r})\n"
        f"archive_before(store.engine, store.path, archive_root(store.path), "
        f"day_start(date.fromisoformat({DAY_B.isoformat()!r})), chunk_rows=1000, "
        f"on_writer={crash})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 9, done.stderr


@pytest.mark.parametrize("when", ["before-delete", "after-commit"])
def test_a_crash_in_a_chunk_loses_and_doubles_no_row(tmp_path, when):
    db = tmp_path / "crash.duckdb"
    store = _two_days(db)
    expected = {table: _through_union(store, table) for table in TABLE_NAMES}
    store.close()
    _crash_in_a_run(db, when)

    store = ServiceStore(db)
    root = archive_root(db)
    listed = store.query("SELECT count(*) AS n FROM archive_files")[0]["n"]
    assert listed == (0 if when == "before-delete" else 1)
    assert _on_disk(root, "events") == 1000  # the first chunk's file is durable either way
    for table in TABLE_NAMES:  # read as the service reads: nothing lost, nothing twice
        assert _through_union(store, table) == expected[table], table

    rerun = archive_before(store.engine, db, root, day_start(DAY_B), chunk_rows=1000)
    assert rerun.removed_unlisted == (1 if when == "before-delete" else 0)
    for table in TABLE_NAMES:
        assert _through_union(store, table) == expected[table], table
    archived = store.query("SELECT table_name, sum(rows) AS n FROM archive_files GROUP BY 1")
    assert {r["table_name"]: r["n"] for r in archived} == {
        "events": ROWS - ROWS // 100,
        "violations": ROWS,
        "engine_samples": ROWS,
    }
    for table in ("events", "violations", "engine_samples"):  # the files hold each row once
        assert _on_disk(root, table) == {r["table_name"]: r["n"] for r in archived}[table]
    live_day_a = store.query(
        "SELECT count(*) AS n FROM events WHERE ts < :b", {"b": day_start(DAY_B)}
    )[0]["n"]
    assert live_day_a == ROWS // 100  # the worker announcements stay
    store.close()


def test_a_temporary_file_of_a_crash_while_writing_is_removed(tmp_path):
    db = tmp_path / "tmp.duckdb"
    store = _two_days(db)
    folder = archive_root(db) / "table=events" / f"date={DAY_A.isoformat()}"
    folder.mkdir(parents=True)
    (folder / ".part-crashed.parquet.tmp").write_bytes(b"PAR1 half a file")
    result = archive_before(store.engine, db, archive_root(db), day_start(DAY_B))
    assert result.removed_unlisted == 1 and not (folder / ".part-crashed.parquet.tmp").exists()
    assert _through_union(store, "events")[0] == 2 * ROWS
    store.close()


def test_a_row_arriving_in_a_written_chunk_is_never_deleted_unwritten(tmp_path):
    """A sample stored into the chunk's range between its file and its delete: the delete
    would remove a row the file does not hold, so nothing is deleted and the file goes."""
    db = tmp_path / "late.duckdb"
    store = _two_days(db)
    root = archive_root(db)

    def late_then(work):
        with store.engine.begin() as conn:
            duck_connection(conn).execute(
                "INSERT INTO engine_samples VALUES ('default', 'w1', ?, 1, 0, 0.5, 0, 1)",
                [day_start(DAY_A) + 5.0],
            )
        work()

    samples = (ArchivedTable("engine_samples", "ts"),)
    with pytest.raises(ArchiveMismatch, match="nothing deleted"):
        archive_before(store.engine, db, root, day_start(DAY_B), chunk_rows=1000,
                       on_writer=late_then, tables=samples)  # fmt: skip
    assert _on_disk(root, "engine_samples") == 0
    assert store.query("SELECT count(*) AS n FROM engine_samples")[0]["n"] == ROWS + 1
    again = archive_before(store.engine, db, root, day_start(DAY_B), tables=samples)
    assert again.rows == {"engine_samples": ROWS + 1}
    assert _through_union(store, "engine_samples")[0] == ROWS + 1
    store.close()


def test_retention_days_is_a_storage_setting_with_its_bound(monkeypatch):
    from shadow.service.settings import load_settings

    monkeypatch.setenv("SHADOW_STORAGE__RETENTION_DAYS", "3")
    assert load_settings().storage.retention_days == 3
    monkeypatch.setenv("SHADOW_STORAGE__RETENTION_DAYS", "0")
    with pytest.raises(ValueError, match=r"storage.retention_days: .*greater than or equal to 1"):
        load_settings()
    monkeypatch.delenv("SHADOW_STORAGE__RETENTION_DAYS")
    assert load_settings().storage.retention_days is None  # off by default


def test_a_day_is_archived_once_it_ended_retention_days_ago():
    noon = day_start(DAY_B) + 12 * 3600.0
    assert retention_cutoff(1, noon) == day_start(DAY_A)  # Nov 1 ended 12 h ago: kept
    assert retention_cutoff(1, day_start(DAY_B) + 86400.0) == day_start(DAY_B)


def test_shadow_db_archive(tmp_path):
    from typer.testing import CliRunner

    from shadow.cli import app

    db = tmp_path / "cli.duckdb"
    _two_days(db).close()
    runner = CliRunner()
    bad = runner.invoke(app, ["db", "archive", "--db", str(db), "--before", "1 Nov"])
    assert bad.exit_code == 1 and "--before: '1 Nov' is not a date (YYYY-MM-DD)" in bad.output
    done = runner.invoke(app, ["db", "archive", "--db", str(db), "--before", DAY_B.isoformat()])
    assert done.exit_code == 0, done.output
    moved = f"moved engine_samples {ROWS}, events {ROWS - ROWS // 100}, violations {ROWS} rows"
    assert moved in done.output
    assert _on_disk(archive_root(db), "violations") == ROWS


def test_with_retention_days_the_service_archives_on_schedule(tmp_path):
    """`[storage] retention_days = 1`: a day that ended over a day ago moves by itself,
    its deletes on the group committer; yesterday and today stay."""
    from shadow.service.ingest.committer import GroupCommitter
    from shadow.service.retention import Retention
    from shadow.storage.archive import DAY_S, RetentionConfig

    store = ServiceStore(tmp_path / "scheduled.duckdb")
    today = retention_cutoff(0)
    with store.engine.begin() as conn:
        duck_connection(conn).execute(
            "INSERT INTO violations SELECT i, 'default', 'ghost', 'warning', 'w0', 'r' || i, "
            f"{today - 3 * DAY_S} + i * {DAY_S / 100}, 'x' FROM range(400) t(i)"
        )  # 100 rows on each of the days 3, 2 and 1 before today, and 100 today
    committer = GroupCommitter(store.commit)
    retention = Retention(store, committer, RetentionConfig(retention_days=1, chunk_rows=100))
    retention.start()
    deadline = time.monotonic() + 30
    while retention.runs == 0 and retention.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    retention.close()
    committer.close()
    assert retention.failures == 0 and retention.runs == 1
    assert retention.last is not None and retention.last.rows == {"violations": 200}
    assert len(retention.last.days) == 2
    live = store.query("SELECT min(ts) AS t0, count(*) AS n FROM violations")[0]
    assert live["n"] == 200 and live["t0"] >= today - DAY_S
    assert _through_union(store, "violations") == (400, 400)
    store.close()
