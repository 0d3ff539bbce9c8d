"""`shadow bench ingest --counterfactuals` on a small log: both paths make and store the
same windows, and their clocks run until the last one is stored."""

from __future__ import annotations

from shadow.bench import ingest


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
