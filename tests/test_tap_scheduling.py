"""The tap's scheduling slice (`connectors.tap.scheduling`) on this machine's real kernel,
and the `shadow tap` process asking for it: read back from the kernel, not from our state.

Custom slices need Linux 6.12+ (EEVDF); on an older kernel these tests skip, saying so."""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shadow.connectors.tap.config import TapConfigError, config_from_mapping
from shadow.connectors.tap.scheduling import current_slice_us, request_slice
from shadow.world.process import REPO, free_port


def _kernel_has_custom_slices() -> bool:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return (
        platform.system() == "Linux"
        and found is not None
        and ((int(found[1]), int(found[2])) >= (6, 12))
    )


needs_custom_slices = pytest.mark.skipif(
    not _kernel_has_custom_slices(), reason=f"custom slices need Linux 6.12+ ({platform.release()})"
)


def _in_a_thread(function):
    """`function()` on a thread of its own: a slice is the calling thread's (and what it
    starts afterwards), and the test runner's thread keeps the kernel's."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(function()))
    thread.start()
    thread.join()
    return out[0]


@needs_custom_slices
def test_a_thread_gets_the_slice_it_asks_for_and_keeps_its_nice_value():
    default = current_slice_us()
    assert default is not None and default != 250.0

    def ask():
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 5)
        outcome = request_slice(250)
        return outcome, current_slice_us(), os.getpriority(os.PRIO_PROCESS, tid)

    outcome, seen, nice = _in_a_thread(ask)
    assert outcome.problem is None and outcome.slice_us == 250.0 and seen == 250.0
    assert nice == 5  # a request that rebuilt the attributes would have reset it to 0
    assert current_slice_us() == default  # the runner's thread was not touched


@needs_custom_slices
def test_a_request_outside_the_kernels_range_says_what_it_got():
    low = _in_a_thread(lambda: request_slice(20))
    assert low.slice_us == 100.0
    assert low.problem == "20 us is outside the kernel's 100-100000 us: 100 us"
    high = _in_a_thread(lambda: request_slice(200_000))
    assert high.slice_us == 100_000.0 and high.problem is not None


def test_zero_asks_nothing():
    def ask():
        before = current_slice_us()
        return before, request_slice(0), current_slice_us()

    before, outcome, after = _in_a_thread(ask)
    assert outcome.problem is None and outcome.slice_us == before == after


def test_the_config_names_a_bad_slice():
    with pytest.raises(TapConfigError, match=r"^tap\.sched_slice_us: expected an integer >= 0"):
        config_from_mapping({"tap": {"sched_slice_us": -5}})
    assert config_from_mapping({"tap": {"sched_slice_us": 0}}).sched_slice_us == 0


def _run_tap(*extra: str) -> tuple[float | None, float, str]:
    """A `shadow tap` process (its service and engine unreachable: neither is needed to
    start): its main thread's slice as the kernel reports it, its gauge, its output."""
    metrics = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "shadow.cli", "tap", "--service", "http://127.0.0.1:9",
         "--engine", "worker=w0,upstream=http://127.0.0.1:9,listen=127.0.0.1:0",
         "--metrics-listen", f"127.0.0.1:{metrics}", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()
            try:
                page = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=1).text
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the tap did not serve /metrics in 60 s"
                time.sleep(0.1)
        gauge = next(
            (sample.value
             for family in text_string_to_metric_families(page)
             if family.name == "shadow_tap_sched_slice_seconds"
             for sample in family.samples),
            None,
        )  # fmt: skip
        assert gauge is not None, "no shadow_tap_sched_slice_seconds on the tap's /metrics"
        slice_us = current_slice_us(process.pid)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
    return slice_us, gauge, output


@needs_custom_slices
def test_shadow_tap_asks_for_its_slice_and_reports_it():
    asked, gauge, output = _run_tap()
    assert asked == 100.0  # the default, DEFAULT_SLICE_US
    assert gauge == 100e-6
    assert "tap scheduling slice: 100 us" in output
    default = current_slice_us()
    kept, gauge_kept, _ = _run_tap("--sched-slice-us", "0")
    assert kept == default and gauge_kept == default / 1e6
