"""`shadow bench load` end to end at a small rate (the 5-minute run is a benchmark, not a
test): every acknowledged event is found stored once, and memory is reported per process."""

from __future__ import annotations

import pytest

from shadow.bench.load import growth_mib_per_min, run


def test_growth_is_the_slope_in_mib_per_minute():
    assert growth_mib_per_min([(60.0, 300.0), (120.0, 301.0), (180.0, 302.0)]) == pytest.approx(1.0)
    assert growth_mib_per_min([(60.0, 300.0)]) is None


def test_a_short_load_run_stores_every_acknowledged_event_once(tmp_path):
    report = run(
        rate=4000, duration_s=4, batch=500, senders=2, requests=300, workdir=tmp_path, note=print
    )
    assert report["events_acknowledged"] > 0 and report["failed_batches"] == 0
    assert report["lost"] == {} and report["duplicates"] == 0
    assert report["violations"] == {}  # each fleet streamed in order: nothing to flag
    assert report["progress"]["stored_latest_rows"] == report["progress"]["requests"]
    server_kib, workers_kib = report["rss_series"][-1][1:]
    assert server_kib > 10_000 and workers_kib > 10_000  # the server and its audit worker
    assert report["rss_mib"]["end"] == pytest.approx((server_kib + workers_kib) / 1024)
    # the sustained rate counts only what was acknowledged while the load ran
    assert report["events_offered"] >= report["events_acknowledged"]
    assert 0 < report["sustained_events_per_s"] <= report["events_acknowledged"] / 3.5
    behind = report["behind_schedule_s"]
    assert 0.0 <= behind["end"] <= behind["max"]
