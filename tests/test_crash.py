"""Crashes and storage faults of a real `shadow serve`: SIGKILL in the middle of bulk
writes, a second server on the same file, a full disk."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shadow.events import parse_ndjson
from shadow.service.footprint import process_tree
from shadow.service.runtime import Runtime
from shadow.service.settings import load_settings
from shadow.service.store import ServiceStore, StorageError
from shadow.world.process import ServerProcess, free_port
from tests.service_helpers import write_config

WORKERS = 4
REQUESTS_PER_BATCH = 20  # each: ready, dispatch, finish; plus one engine step per worker


class Stream:
    """An event stream cut into self-contained batches (every request of a batch is
    ready, dispatched and finished in it), each event with a unique (source, seq)."""

    def __init__(self) -> None:
        self.batches = 0
        self.seq = {"router": 0, "engine": 0}
        self.step = 0

    def _stamp(self, source: str, event: dict) -> dict:
        event.update(source=source, seq=self.seq[source])
        self.seq[source] += 1
        return event

    def fleet(self) -> list[dict]:
        return [
            self._stamp("router", {"type": "worker", "ts": 0.0, "worker": f"w{w}", "capacity": 64})
            for w in range(WORKERS)
        ]

    def batch(self) -> list[dict]:
        index = self.batches
        self.batches += 1
        t0 = 1.0 + index
        events = []
        for i in range(REQUESTS_PER_BATCH):
            rid = f"b{index}-r{i}"
            ts = t0 + i * 0.02
            events.append(self._stamp("router", {"type": "ready", "ts": ts, "request_id": rid,
                                                 "prompt_tokens": 100 + i}))  # fmt: skip
            events.append(self._stamp("router", {"type": "dispatch", "ts": ts + 0.005,
                                                 "request_id": rid, "worker": f"w{i % WORKERS}",
                                                 "policy": "jsq"}))  # fmt: skip
            events.append(self._stamp("router", {"type": "finish", "ts": ts + 0.01,
                                                 "request_id": rid, "output_tokens": 3,
                                                 "reason": "stop"}))  # fmt: skip
        for w in range(WORKERS):
            events.append(self._stamp("engine", {"type": "engine_step", "ts": t0 + 0.9,
                                                 "worker": f"w{w}", "step": self.step,
                                                 "duration_ms": 20.0, "running": 0}))  # fmt: skip
        self.step += 1
        return events


def body(events: list[dict]) -> bytes:
    return "\n".join(json.dumps(e) for e in events).encode()


def keys(events: list[dict]) -> set[tuple[str, int]]:
    return {(e["source"], e["seq"]) for e in events}


def stored_keys(store: ServiceStore) -> list[tuple[str, int]]:
    rows = store.query(
        "SELECT source, seq FROM events UNION ALL SELECT source, seq FROM engine_steps"
    )
    return [(r["source"], r["seq"]) for r in rows]


class Client(threading.Thread):
    """Posts batches until stopped or until the server goes away; remembers what was
    acknowledged, what was sent, and the batch that got no answer."""

    def __init__(self, url: str, stream: Stream, first: list[dict] | None) -> None:
        super().__init__()
        self.url, self.stream, self.first = url, stream, first
        self.stop = threading.Event()
        self.acknowledged: set[tuple[str, int]] = set()
        self.sent: set[tuple[str, int]] = set()
        self.dispatches = 0
        self.unanswered: list[dict] | None = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._post()
        except BaseException as error:  # reported by the test
            self.failure = error

    def _post(self) -> None:
        events = self.first if self.first is not None else self.stream.batch()
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                self.sent |= keys(events)
                try:
                    response = http.post(f"{self.url}/v1/events", content=body(events))
                except httpx.HTTPError:
                    self.unanswered = events
                    return
                assert response.status_code == 200, response.text
                reply = response.json()
                assert reply["rejected"] == 0
                assert reply["accepted"] + reply["duplicates"] == len(events)
                self.acknowledged |= keys(events)
                self.dispatches += sum(e["type"] == "dispatch" for e in events)
                events = self.stream.batch()


def test_sigkill_during_bulk_writes_loses_and_duplicates_nothing(tmp_path):
    """20 times: a client posts batches while the server is killed at a random moment;
    the server starts again on the same file and the client goes on (retrying the batch
    that got no answer, or not). Every acknowledged event is stored exactly once."""
    rng = random.Random(20261130)
    db = tmp_path / "crash.duckdb"
    config = write_config(tmp_path / "c.toml", windows=False)
    stream = Stream()
    acknowledged: set[tuple[str, int]] = set()
    sent: set[tuple[str, int]] = set()
    fleet = stream.fleet()
    unanswered: list[dict] | None = fleet  # sent first, and until acknowledged
    dispatches_acked = 0
    killed_in_flight = 0
    server = ServerProcess(db, config)
    try:
        for _ in range(20):
            server.start()
            retry = unanswered if unanswered is fleet or rng.random() < 0.7 else None
            client = Client(server.url, stream, retry)
            client.start()
            time.sleep(rng.uniform(0.05, 0.5))
            server.kill()
            client.stop.set()
            client.join(timeout=30)
            assert not client.is_alive() and client.failure is None, client.failure
            acknowledged |= client.acknowledged
            sent |= client.sent
            dispatches_acked += client.dispatches
            unanswered = client.unanswered
            killed_in_flight += unanswered is not None
        # a last start: the database opens, the stream's state is rebuilt
        server.start()
        with httpx.Client(timeout=30) as http:
            assert http.post(f"{server.url}/v1/flush").status_code == 200
            snapshot = http.get(f"{server.url}/v1/fleets/default/snapshot").json()
        server.stop()
        assert server.process is not None and server.process.returncode == 0
    finally:
        server.kill()

    assert killed_in_flight >= 10  # most kills hit a request in flight
    store = ServiceStore(db)
    try:
        stored = stored_keys(store)
        assert len(stored) == len(set(stored)), "an event is stored twice"
        assert acknowledged <= set(stored), f"lost: {sorted(acknowledged - set(stored))[:5]}"
        assert set(stored) <= sent
        audit = store.query(
            "SELECT count(*) AS n, count(DISTINCT (ingest_id, policy)) AS distinct_rows, "
            "count(DISTINCT ingest_id) AS dispatches FROM decisions"
        )[0]
        dispatches = "SELECT count(*) AS n FROM events WHERE type = 'dispatch'"
        stored_dispatches = store.query(dispatches)[0]["n"]
        assert audit["n"] == audit["distinct_rows"]  # no decision derived twice
        assert audit["dispatches"] == stored_dispatches >= dispatches_acked
        assert store.query("SELECT count(*) AS n FROM violations")[0]["n"] == 0
    finally:
        store.close()
    # every batch finishes what it starts: the rebuilt fleet is idle
    assert [w["active"] for w in snapshot["workers"]] == [0] * WORKERS
    assert snapshot["pool"] == 0


def test_ctrl_c_to_the_process_group_answers_the_batches_in_flight(tmp_path):
    """Ctrl-C (or `timeout`) signals the server and its worker processes together; the
    workers wait for the server to stop them, so batches in flight are answered, not
    failed by a dead audit worker (a broken pool: 500s and a traceback on the way out)."""
    db = tmp_path / "group.duckdb"
    stream = Stream()
    server = ServerProcess(db, write_config(tmp_path / "c.toml"), own_group=True)
    try:
        server.start()
        client = Client(server.url, stream, stream.fleet())
        client.start()
        time.sleep(1.5)
        assert client.acknowledged and client.is_alive()
        server.signal_group(signal.SIGTERM)
        assert server.process is not None
        server.process.wait(timeout=60)
        client.stop.set()
        client.join(timeout=30)
        output = server.process.stdout.read().decode() if server.process.stdout else ""
    finally:
        server.kill()
    assert client.failure is None, client.failure  # every answer was a 200
    assert "Traceback" not in output and "BrokenProcessPool" not in output, output[-3000:]
    # uvicorn shuts down, then re-raises the signal it caught
    assert server.process.returncode in (0, -signal.SIGTERM)
    store = ServiceStore(db)
    try:
        stored = set(stored_keys(store))
    finally:
        store.close()
    assert client.acknowledged <= stored


def test_a_killed_audit_worker_stops_ingest_with_a_clear_error(tmp_path):
    """The audit worker killed from outside (the OOM killer): batches get a 503 that says
    so, never a 500, and what was acknowledged before is stored."""
    db = tmp_path / "oom.duckdb"
    stream = Stream()
    server = ServerProcess(db, write_config(tmp_path / "c.toml", windows=False))
    acknowledged: set[tuple[str, int]] = set()
    answers: list[tuple[int, str]] = []
    try:
        server.start()
        assert server.process is not None
        with httpx.Client(timeout=30) as http:
            first = stream.fleet() + stream.batch()
            assert http.post(f"{server.url}/v1/events", content=body(first)).status_code == 200
            acknowledged |= keys(first)
            workers: list[int] = []
            deadline = time.monotonic() + 20
            while not workers and time.monotonic() < deadline:  # pools spawn lazily
                time.sleep(0.2)
                workers = [
                    pid for pid in process_tree(server.process.pid)[1:]
                    if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
                ]  # fmt: skip
            assert workers
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            for _ in range(40):
                events = stream.batch()
                response = http.post(f"{server.url}/v1/events", content=body(events))
                answers.append((response.status_code, response.json()["detail"]
                                if response.status_code != 200 else ""))  # fmt: skip
                if response.status_code == 200:
                    acknowledged |= keys(events)
                elif len(answers) > 1 and answers[-2][0] == 503:
                    break
                time.sleep(0.1)
    finally:
        server.kill()
    codes = [code for code, _ in answers]
    assert 500 not in codes and codes[-2:] == [503, 503], answers
    first_refusal = next(detail for code, detail in answers if code == 503)
    assert first_refusal == "ingest stopped: the audit worker process died; restart the service"
    assert (
        answers[-1][1] == "ingest stopped after the audit worker process died; restart the service"
    )
    store = ServiceStore(db)
    try:
        assert acknowledged <= set(stored_keys(store))
    finally:
        store.close()


def test_a_taken_port_is_a_clear_error_before_anything_starts(tmp_path):
    """The port is taken first, before the database and the demo world: a port someone
    else holds stops the command at once, and one the service holds stays its own while
    the demo world starts (uvicorn alone would bind only after the lifespan)."""
    db = tmp_path / "port.duckdb"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        command = [sys.executable, "-m", "shadow.cli", "serve", "--db", str(db),
                   "--port", str(port), "--demo"]  # fmt: skip
        refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in message, message
    assert "Traceback" not in refused.stderr + refused.stdout
    assert "demo:" not in refused.stdout  # nothing was announced, nothing started
    # a port the service took is its own from the banner on, while the demo world starts
    service = ServerProcess(db, demo=True).launch()
    try:
        assert service.process is not None and service.process.stdout is not None
        banner = ""
        while "Ctrl-C" not in banner and service.process.poll() is None:
            banner += service.process.stdout.readline().decode()
        with socket.socket() as intruder, pytest.raises(OSError) as taken:
            intruder.bind(("127.0.0.1", service.port))
        assert taken.value.errno == errno.EADDRINUSE
        # and it serves on it; Ctrl-C then stops it cleanly (uvicorn re-raises the signal)
        service.wait_ready()
    finally:
        service.stop()
    assert service.process.returncode == 0, banner


def _stall_a_batch(port: int) -> socket.socket:
    """A `POST /v1/events` whose body never finishes arriving."""
    stalled = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
    stalled.sendall(f"{head}Content-Length: 100000\r\n\r\n{{".encode())
    time.sleep(0.5)
    return stalled


def _output_after_exit(service: ServerProcess) -> str:
    assert service.process is not None and service.process.stdout is not None
    output = service.process.stdout.read().decode()  # until it exits
    service.process.wait(timeout=60)
    return output


def test_a_second_ctrl_c_skips_the_wait_for_open_requests_but_not_the_shutdown(tmp_path):
    """Ctrl-C waits for requests in flight; a second one stops waiting, as in uvicorn, but
    the lifespan still stops the workers and closes the database. uvicorn alone skipped
    that shutdown, and asyncio then cancelled the lifespan and printed its traceback (as
    `timeout -s INT`, which signals the process and then its group, did to the demo)."""
    config = write_config(tmp_path / "c.toml", windows=False)
    service = ServerProcess(tmp_path / "twice.duckdb", config).start()
    assert service.process is not None
    with _stall_a_batch(service.port):
        service.process.send_signal(signal.SIGINT)
        time.sleep(2.0)
        assert service.process.poll() is None  # still waiting for the stalled request
        service.process.send_signal(signal.SIGINT)
        output = _output_after_exit(service)
    assert service.process.returncode == 0, output
    assert "Traceback" not in output and "Error" not in output, output
    assert "stopping without waiting for open requests" in output, output
    # the shutdown ran: the database is closed and whole, and opens again at once
    ServerProcess(tmp_path / "twice.duckdb", config).start().stop()


def test_one_ctrl_c_ends_a_stalled_request_after_the_grace_period(tmp_path):
    """A sender that never finishes its batch holds a stop for the grace period only; a
    sender that disconnects mid-batch is counted, with a line in the log, not a traceback."""
    from shadow.service.http.server import GRACE_S

    config = write_config(tmp_path / "c.toml", windows=False)
    service = ServerProcess(tmp_path / "once.duckdb", config).start()
    assert service.process is not None
    _stall_a_batch(service.port).close()  # gone mid-batch
    metrics = httpx.get(f"{service.url}/metrics", timeout=10).text
    assert "shadow_ingest_disconnects_total 1.0" in metrics
    with _stall_a_batch(service.port):
        begun = time.monotonic()
        service.process.send_signal(signal.SIGINT)
        output = _output_after_exit(service)
        took = time.monotonic() - begun
    assert service.process.returncode == 0, output
    assert GRACE_S <= took < GRACE_S + 30, (took, output)
    assert "Traceback" not in output and "Error" not in output, output
    assert "a sender disconnected before its batch (100000 bytes) arrived whole" in output
    assert "1 open requests after 10 s; ending them" in output, output


def test_a_second_server_on_the_same_database_gets_a_clear_error(tmp_path):
    db = tmp_path / "busy.duckdb"
    config = write_config(tmp_path / "c.toml", windows=False)
    first = ServerProcess(db, config).start()
    try:
        command = [sys.executable, "-m", "shadow.cli", "serve", "--db", str(db),
                   "--port", str(free_port()), "--no-demo", "--config", str(config)]  # fmt: skip
        second = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second.stdout + second.stderr
        message = " ".join(second.stderr.split())
        assert f"{db} is in use by process {first.process.pid}" in message, message
        assert "Traceback" not in second.stderr + second.stdout
        # `shadow ingest` says the same
        log = tmp_path / "events.jsonl"
        log.write_bytes(body(Stream().fleet()))
        ingest = subprocess.run(
            [sys.executable, "-m", "shadow.cli", "ingest", str(log), "--db", str(db)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ingest.returncode == 1
        assert f"{db} is in use by process" in " ".join(ingest.stderr.split())
        # the first one never noticed
        with httpx.Client(timeout=30) as http:
            reply = http.post(f"{first.url}/v1/events", content=body(Stream().fleet()))
            assert reply.status_code == 200 and reply.json()["accepted"] == WORKERS
            assert http.get(f"{first.url}/healthz").json()["ok"] is True
    finally:
        first.stop()


# -- a full disk -----------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """An 8 MiB tmpfs, most of it taken by a filler file (so that it fills in seconds)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"the full-disk tests mount a small tmpfs (as root): {done.stderr.strip()}")
    try:
        (mount / "filler").write_bytes(b"\0" * 5_000_000)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def ready_batch(first_seq: int, n: int = 500) -> list[dict]:
    """Ready events with long ids and hashes: a few hundred kB per batch."""
    return [
        {"type": "ready", "ts": (first_seq + i) * 0.001, "source": "router",
         "seq": first_seq + i, "request_id": f"req-{first_seq + i:09d}-{'x' * 100}",
         "prompt_tokens": 100, "prompt_hash": "h" * 200}
        for i in range(n)
    ]  # fmt: skip


def test_a_full_disk_is_a_clear_error_and_corrupts_nothing(tmp_path, small_disk):
    db = small_disk / "shadow.duckdb"
    config = write_config(tmp_path / "c.toml", windows=False)
    acknowledged: set[tuple[str, int]] = set()
    server = ServerProcess(db, config).start()
    try:
        with httpx.Client(timeout=30) as http:
            seq = 0
            for _ in range(200):
                events = ready_batch(seq)
                seq += len(events)
                first = http.post(f"{server.url}/v1/events", content=body(events))
                if first.status_code != 200:
                    break
                acknowledged |= keys(events)
            else:
                pytest.fail("the disk never filled")
            failed = events
            assert acknowledged, "the disk filled before anything was stored"
        # the service stays up and says why it stopped taking events
        for _ in range(3):
            with httpx.Client(timeout=30) as http:
                again = http.post(f"{server.url}/v1/events", content=body(ready_batch(seq, 5)))
                assert again.status_code in (503, 507), again.text
                assert "storage" in again.json()["detail"] or "disk" in again.json()["detail"]
                health = http.get(f"{server.url}/healthz")
                assert health.status_code == 200 and health.json()["ok"] is False
                assert http.get(f"{server.url}/v1/fleets").status_code == 200  # reads work
        assert server.process is not None and server.process.poll() is None
        server.stop()
        assert server.process.returncode == 0
        # space again: the database opens with every acknowledged event, once
        os.remove(small_disk / "filler")
        server.start()
        with httpx.Client(timeout=30) as http:
            retried = http.post(f"{server.url}/v1/events", content=body(failed))
            assert retried.status_code == 200
            assert retried.json()["accepted"] + retried.json()["duplicates"] == len(failed)
            acknowledged |= keys(failed)
        server.stop()
    finally:
        server.kill()
    store = ServiceStore(db)
    try:
        stored = stored_keys(store)
        assert len(stored) == len(set(stored)) == len(acknowledged)
        assert set(stored) == acknowledged
    finally:
        store.close()
    # the answer to the batch that hit the full disk
    assert first.status_code == 507, first.text
    assert "full" in first.json()["detail"] and str(db) in first.json()["detail"]


def test_a_full_disk_in_process_raises_a_storage_error_naming_the_file(tmp_path, small_disk):
    db = small_disk / "shadow.duckdb"
    settings = load_settings(None, db=db, windows=False, workers_processes=False)
    runtime = Runtime(settings)
    seq = 0
    acknowledged: set[tuple[str, int]] = set()
    try:
        with pytest.raises(StorageError) as failure:
            for _ in range(200):
                events = ready_batch(seq)
                seq += len(events)
                parsed, errors = parse_ndjson(body(events))
                runtime.pipeline.submit(parsed, errors)
                acknowledged |= keys(events)
        assert failure.value.disk_full
        message = str(failure.value)
        assert str(db) in message and "full" in message, message
        assert runtime.pipeline.broken
        with pytest.raises(RuntimeError, match="restart it from the database"):
            runtime.pipeline.submit([])
    finally:
        runtime.close()
    os.remove(small_disk / "filler")
    store = ServiceStore(db)
    try:
        stored = stored_keys(store)
        assert len(stored) == len(set(stored))
        assert set(stored) == acknowledged
    finally:
        store.close()


def test_shadow_ingest_on_a_full_disk_says_so(tmp_path, small_disk):
    log = tmp_path / "big.jsonl"
    with log.open("wb") as out:
        for first in range(0, 20_000, 500):
            out.write(body(ready_batch(first)) + b"\n")
    db = small_disk / "shadow.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "shadow.cli", "ingest", str(log), "--db", str(db), "--batch",
         "500", "--no-windows"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert re.search(r"error: storage failed: .*full", message), message
    assert "Traceback" not in done.stderr
