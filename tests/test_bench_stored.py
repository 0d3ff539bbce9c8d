"""The benchmarks' "every acknowledged event stored once" reads a real service database:
what the ingest path wrote, and a row written twice behind its back."""

from __future__ import annotations

import json

import duckdb

from shadow.bench.stored import stored_events
from shadow.events import parse_ndjson
from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
from shadow.service.store import ServiceStore


def ingest(path, events: list[dict]) -> None:
    config = PipelineConfig(audit_enabled=False, windows_enabled=False, source_wait_s=0.0)
    store = ServiceStore(path)
    pipeline = Pipeline(store, config)
    pipeline.start()
    try:
        # each event numbered by its source, as the benchmarks' streams are: a row stored
        # twice is one (fleet, source, seq) held twice
        lines = (json.dumps({**event, "seq": seq}) for seq, event in enumerate(events))
        parsed, errors = parse_ndjson("\n".join(lines))
        assert not errors, errors
        pipeline.submit(parsed)
        pipeline.drain()
    finally:
        pipeline.close()
        store.close()


STREAM = [
    {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 8},
    {"type": "ready", "ts": 1.0, "request_id": "a", "prompt_tokens": 50},
    {"type": "ready", "ts": 1.0, "request_id": "b", "prompt_tokens": 70},
    {"type": "dispatch", "ts": 1.0, "request_id": "a", "worker": "w0"},
    {"type": "dispatch", "ts": 1.0, "request_id": "b", "worker": "w0"},
    {"type": "engine_step", "ts": 1.5, "worker": "w0", "step": 0, "duration_ms": 20.0,
     "running": 2},
    {"type": "progress", "ts": 2.0, "request_id": "a", "generated": 4},
    {"type": "finish", "ts": 3.0, "request_id": "a", "output_tokens": 9, "reason": "stop"},
]  # fmt: skip


def test_stored_events_count_each_kind_once_and_name_a_row_written_twice(tmp_path):
    db = tmp_path / "stored.duckdb"
    ingest(db, STREAM)
    acknowledged = {"ready": 2, "dispatch": 2, "engine_step": 1, "finish": 1}
    with duckdb.connect(str(db), read_only=True) as con:
        held = stored_events(con)
    assert held.by_kind == acknowledged  # progress is kept as each request's latest
    assert held.duplicates == 0 and held.missing(acknowledged) == {}
    assert held.progress_requests == 1 and held.decisions == 0  # the audit was off

    # one dispatch and one engine step stored a second time, one finish lost
    with duckdb.connect(str(db)) as con:
        con.execute("INSERT INTO events SELECT * FROM events WHERE type = 'dispatch' LIMIT 1")
        con.execute("INSERT INTO engine_steps SELECT * FROM engine_steps")
        con.execute("DELETE FROM events WHERE type = 'finish'")
    with duckdb.connect(str(db), read_only=True) as con:
        held = stored_events(con)
    assert held.duplicates == 2
    assert held.missing(acknowledged) == {"dispatch": -1, "engine_step": -1, "finish": 1}
    assert held.missing(acknowledged, skip=("finish",)) == {"dispatch": -1, "engine_step": -1}
