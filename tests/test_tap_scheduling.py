"""The tap's scheduling slice (`connectors.tap.scheduling`) on this machine's real kernel,
and the `shadow tap` process asking for it: read back from /proc, not from our own state."""

from __future__ import annotations

import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from shadow.connectors.tap.config import TapConfigError, config_from_mapping
from shadow.connectors.tap.scheduling import current_slice_us, request_slice
from shadow.world.process import REPO, free_port


def _kernel_has_custom_slices() -> bool:
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return platform.system() == "Linux" and (major, minor) >= (6, 12)


def _in_a_thread(function):
    """`function()` on a thread of its own: the slice belongs to the calling thread, and
    the test runner's thread keeps the kernel's."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(function()))
    thread.start()
    thread.join()
    return out[0]


def _slice_of(pid: int) -> float:
    for line in Path(f"/proc/{pid}/task/{pid}/sched").read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "se.slice":
            return int(value) / 1000
    raise AssertionError(f"/proc/{pid}/task/{pid}/sched shows no se.slice")


def test_a_thread_gets_the_slice_it_asks_for_and_only_that_thread():
    default = current_slice_us()
    outcome, seen = _in_a_thread(lambda: (request_slice(250), current_slice_us()))
    if _kernel_has_custom_slices():
        assert outcome.problem is None and outcome.slice_us == 250.0 and seen == 250.0
    else:  # the kernel keeps its slice and the outcome says which kernel it needs
        assert outcome.problem is not None and "6.12" in outcome.problem
    assert current_slice_us() == default  # this thread was not touched


def test_a_request_outside_the_kernels_range_says_what_it_got():
    outcome = _in_a_thread(lambda: request_slice(20))
    if _kernel_has_custom_slices():
        assert outcome.slice_us == 100.0
        assert outcome.problem == "20 us is outside the kernel's 100-100000 us: 100 us"


def test_the_config_names_a_bad_slice():
    try:
        config_from_mapping({"tap": {"sched_slice_us": -5}})
    except TapConfigError as error:
        assert str(error).startswith("tap.sched_slice_us: expected an integer >= 0")
    else:
        raise AssertionError("a negative slice was accepted")
    assert config_from_mapping({"tap": {"sched_slice_us": 0}}).sched_slice_us == 0


def _run_tap(*extra: str) -> tuple[float, float]:
    """A `shadow tap` process (its service and engine unreachable: neither is needed to
    start): the relay thread's slice from /proc and the tap's gauge."""
    metrics = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "shadow.cli", "tap", "--service", "http://127.0.0.1:9",
         "--engine", "worker=w0,upstream=http://127.0.0.1:9,listen=127.0.0.1:0",
         "--metrics-listen", f"127.0.0.1:{metrics}", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
            sample.value
            for family in text_string_to_metric_families(page)
            if family.name == "shadow_tap_sched_slice_seconds"
            for sample in family.samples
        )
        return _slice_of(process.pid), gauge
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def test_shadow_tap_asks_for_its_slice_and_reports_it():
    default = current_slice_us()
    asked, gauge = _run_tap()
    if _kernel_has_custom_slices():
        assert asked == 100.0  # the default, DEFAULT_SLICE_US
        assert gauge == 100e-6
    kept, gauge_kept = _run_tap("--sched-slice-us", "0")
    assert kept == default and gauge_kept == default / 1e6
