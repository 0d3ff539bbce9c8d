"""`shadow bench ingest --counterfactuals` on a small log: both paths make and store the
same windows, and their clocks run until the last one is stored."""

from __future__ import annotations

import gc
import sys

import pytest

from shadow.bench import ingest
from shadow.service.interpreter import SWITCH_INTERVAL_S, YOUNG_THRESHOLD


def test_both_paths_store_every_window_of_the_log_before_the_clock_stops(tmp_path):
    report = ingest.run(requests=600, workdir=tmp_path, counterfactuals=True)
    file_result, http_result = report["results"]
    assert report["counterfactuals"] is True
    assert file_result["windows"] >= 3, "a log of minutes makes several 30 s windows"
    assert http_result["windows"] == file_result["windows"]
    for result in (file_result, http_result):
        assert result["events"] == report["log"]["events"]
        assert result["seconds"] >= result["acknowledged_seconds"] > 0
    # CPU per event by process: the window worker's evaluations are counted, apart
    assert set(file_result["cpu_us_per_event"]) == {"ingest", "audit", "windows"}
    assert file_result["cpu_us_per_event"]["ingest"] > 0
    assert file_result["cpu_us_per_event"]["windows"] > 0
    assert set(http_result["cpu_us_per_event"]) == {"server", "workers"}
    assert http_result["cpu_us_per_event"]["server"] > 0
    assert http_result["cpu_us_per_event"]["workers"] > 0


def test_without_the_windows_no_window_is_counted(tmp_path):
    report = ingest.run(requests=300, workdir=tmp_path)
    assert [r["windows"] for r in report["results"]] == [None, None]


def test_the_file_pass_sets_up_its_interpreter_as_shadow_ingest_does(tmp_path):
    """The file pass times `shadow ingest`'s pipeline in this process: with CPython's
    default collector it ran a full collection over the mirror every second or so, a cost
    the command, which tunes its interpreter first, does not pay."""
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(700, 10, 10)
    sys.setswitchinterval(0.005)
    try:
        recording = ingest.record(tmp_path, 200)
        ingest.bench_file(recording, tmp_path / "file.duckdb")
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
