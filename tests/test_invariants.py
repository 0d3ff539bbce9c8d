"""The invariant checker reports each incident once, and forgets per-request incidents
with the requests, so a source that misbehaves on every request cannot grow it without
bound."""

from __future__ import annotations

from shadow.stream.fleet import FleetCore


def test_incidents_are_reported_once_and_forgotten_with_their_requests():
    core = FleetCore("f", sweep_every_s=1e12)  # no ghost sweeps: only these incidents
    core.worker(0.0, "w0", 1_000_000, "up")
    # every dispatch lacks its ready: one incident per request
    first = [core.dispatch(float(t), f"r{t}", "w0") for t in range(1, 1001)]
    assert all(len(found) == 1 and found[0].kind == "dispatch_without_ready" for found in first)
    assert core.checker.remembered == 1000
    again = core.dispatch(1000.5, "r1000", "w0")
    assert [v.kind for v in again] == ["double_dispatch"]
    assert core.dispatch(1000.6, "r1000", "w0") == []  # that incident is already reported
    assert core.checker.remembered == 1001
    core.forget(500.5)
    assert core.checker.remembered == 501  # r1..r500 forgotten; r501..r1000 kept
    assert core.dispatch(1000.7, "r1000", "w0") == []  # still remembered


def _drifting(seconds: float, every: float = 0.25) -> list[str]:
    """A worker the mirror holds 9 on while its engine runs 1, scraped every `every` s for
    `seconds`: the drift kinds reported."""
    core = FleetCore("f", sweep_every_s=1e12)
    core.worker(0.0, "w0", 16, "up")
    for i in range(9):
        core.ready(0.1, f"r{i}", 100, None)
        core.dispatch(0.2, f"r{i}", "w0")
    found = []
    for k in range(int(seconds / every) + 1):
        found += [
            v.kind for v in core.checker.on_engine_sample(core.mirror, 1.0 + k * every, "w0", 1)
        ]
    return found


def test_drift_is_reported_once_it_lasts_not_for_a_burst():
    assert _drifting(1.0) == []  # 5 scrapes in 1 s: a burst the engine has not taken yet
    assert _drifting(4.0) == ["engine_drift"]  # past drift_min_s (3 s)
