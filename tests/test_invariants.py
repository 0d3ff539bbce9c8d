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
