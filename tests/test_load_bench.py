"""`shadow bench load` end to end at a small rate (the 5-minute run is a benchmark, not a
test): every acknowledged event is found stored once, and memory is reported per process."""

from __future__ import annotations

import os
from itertools import pairwise

import pytest

from shadow.bench.load import growth_mib_per_min, run
from shadow.bench.scrape import metric_sum, metric_value
from shadow.service.footprint import cpu_seconds


def test_growth_is_the_slope_in_mib_per_minute():
    assert growth_mib_per_min([(60.0, 300.0), (120.0, 301.0), (180.0, 302.0)]) == pytest.approx(1.0)
    assert growth_mib_per_min([(60.0, 300.0)]) is None


def test_metrics_text_values_are_read_by_name_and_summed_over_labels():
    text = (
        "# TYPE shadow_audit_skipped_total counter\n"
        'shadow_audit_skipped_total{fleet="0"} 3.0\n'
        'shadow_audit_skipped_total{fleet="1"} 4.0\n'
        "shadow_audit_lag_seconds 1.5\n"
        "shadow_audit_lag_seconds_max 9.0\n"
    )
    assert metric_sum(text, "shadow_audit_skipped_total") == 7.0
    assert metric_value(text, "shadow_audit_skipped_total") == 3.0  # the first series
    assert metric_value(text, "shadow_audit_lag_seconds") == 1.5  # not the _max one
    assert metric_value(text, "shadow_absent") == 0.0


def test_cpu_seconds_grow_with_work_and_a_gone_process_has_none():
    before = cpu_seconds(os.getpid())
    sum(i * i for i in range(3_000_000))
    assert before is not None and cpu_seconds(os.getpid()) > before
    assert cpu_seconds(2**22 + 1) is None  # above Linux's hard limit on pids (PID_MAX_LIMIT)


def test_a_short_load_run_stores_every_acknowledged_event_once(tmp_path):
    report = run(
        rate=4000, duration_s=4, batch=500, senders=2, requests=300, workdir=tmp_path,
        interval_s=2.0, note=print,
    )  # fmt: skip
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
    # each interval: the rate, and what the server and its worker spent per event
    intervals = report["intervals"]
    ends = [i["end_s"] for i in intervals]
    assert len(ends) >= 1 and ends[0] >= 2.0
    assert all(later - earlier >= 2.0 for earlier, later in pairwise(ends))
    assert all(i["end_s"] - i["start_s"] >= 2.0 for i in intervals)
    assert all(a["end_s"] == b["start_s"] for a, b in pairwise(intervals))  # no gaps
    busy = [i for i in intervals if i["events_per_s"] > 0]
    assert busy and all(i["server_cpu_us_per_event"] > 0 for i in busy)
    spread = report["server_cpu_us_per_event"]
    assert 0 < spread["min"] <= spread["median"] <= spread["max"]
    # the audit read from the service's /metrics as the load stopped: at this rate it
    # kept up and audited every first dispatch
    audit = report["audit_at_load_end"]
    assert audit["skipped"] == 0 and audit["lag_s"] >= 0.0 and audit["backlog_batches"] >= 0
    assert report["decisions_audited"] > 0


def test_a_load_run_with_the_counterfactuals_on_still_stores_everything(tmp_path):
    """The windows on: the window worker replays every fleet's windows beside the ingest,
    and no acknowledged event is lost for it."""
    report = run(
        rate=4000, duration_s=12, batch=500, senders=2, requests=300, workdir=tmp_path,
        interval_s=4.0, counterfactuals=True, note=print,
    )  # fmt: skip
    assert report["counterfactuals"] is True
    assert report["events_acknowledged"] > 0 and report["failed_batches"] == 0
    assert report["lost"] == {} and report["duplicates"] == 0
    # each sender streams its fleet ~9x real time: 12 s is minutes of fleet time
    assert report["windows_evaluated"]["windows"] >= 1, report["windows_evaluated"]
