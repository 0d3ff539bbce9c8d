"""Windows and step-model fits are stored together: one transaction and one DuckDB call
for what one pass of the scheduler has ready (`ServiceStore.save_windows`)."""

from __future__ import annotations

import dataclasses
import json

from shadow.events import parse_ndjson
from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
from shadow.service.store import ServiceStore
from tests.service_helpers import batches, record


def _ingest(tmp_path, monkeypatch, fleets=("default",), executor=None):
    """Recorded traffic (one copy per fleet) through a pipeline; every `save_windows`
    call recorded."""
    calls: list[tuple[int, int]] = []
    save = ServiceStore.save_windows

    def counted(self, windows, fits=()):
        calls.append((len(windows), len(fits)))
        return save(self, windows, fits)

    monkeypatch.setattr(ServiceStore, "save_windows", counted)
    log = tmp_path / "events.ndjson"
    record(log, requests=1500)
    store = ServiceStore(tmp_path / "windows.duckdb")
    pipeline = Pipeline(store, PipelineConfig(), executor=executor)
    results = []
    pipeline.on_window = lambda state, result: results.append(result)
    pipeline.start()
    for body in batches(log):
        lines = [json.loads(line) for line in body.splitlines()]
        for fleet in fleets:
            copy = "\n".join(json.dumps({**line, "fleet": fleet}) for line in lines)
            pipeline.submit(parse_ndjson(copy)[0])
    pipeline.drain()
    pipeline.close()
    return store, calls, results


def test_windows_and_fits_are_stored_together(tmp_path, monkeypatch):
    store, calls, results = _ingest(tmp_path, monkeypatch)
    windows = store.query("SELECT window_index, step_model_fitted FROM windows")
    metrics = store.query("SELECT count(*) AS n FROM window_metrics")[0]["n"]
    paths = store.query("SELECT count(*) AS n FROM window_trajectories")[0]["n"]
    fits = store.query("SELECT count(*) AS n FROM step_model_fits")[0]["n"]
    assert len(results) >= 3
    assert sorted(w["window_index"] for w in windows) == sorted(r.index for r in results)
    assert metrics == sum(len(r.metrics) for r in results)
    assert paths == sum(len(r.trajectories) for r in results)
    # every fit made is stored, none alone while windows followed it
    assert fits == sum(f for _, f in calls) >= 1
    assert all(w > 0 for w, _ in calls[:-1])
    store.close()


def test_a_window_given_twice_keeps_its_last_result(tmp_path, monkeypatch):
    store, _, results = _ingest(tmp_path, monkeypatch)
    first = results[0]
    again = dataclasses.replace(first, requests=first.requests + 7)
    monkeypatch.undo()
    store.save_windows([(first, True), (again, False)])
    row = store.query(
        "SELECT requests, step_model_fitted FROM windows WHERE window_index = :i",
        {"i": first.index},
    )
    assert row == [{"requests": first.requests + 7, "step_model_fitted": False}]
    store.close()


def test_windows_evaluated_together_are_stored_together(tmp_path, monkeypatch):
    """Four fleets' windows fall due together and are evaluated one by one in the window
    worker: they are stored in fewer transactions than there are windows, and every one
    is stored by the end."""
    from concurrent.futures import ThreadPoolExecutor

    fleets = ("a", "b", "c", "d")
    with ThreadPoolExecutor(max_workers=1) as executor:
        store, calls, results = _ingest(tmp_path, monkeypatch, fleets, executor)
    stored = store.query("SELECT fleet, window_index FROM windows")
    assert sorted((w["fleet"], w["window_index"]) for w in stored) == sorted(
        (r.fleet, r.index) for r in results
    )
    assert {r.fleet for r in results} == set(fleets)
    assert sum(w for w, _ in calls) == len(results)
    assert len([w for w, _ in calls if w]) < len(results)
    store.close()
