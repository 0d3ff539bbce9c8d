"""The per-fleet mode state machine (pure rules) and its audited DuckDB store."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shadow.modes import auditlog
from shadow.modes.machine import (
    FleetMode,
    Mode,
    ModeConfig,
    ModeError,
    Result,
    freeze,
    note_gate_verdict,
    observe_window,
    reset,
    resume,
    set_mode,
    trip_now,
)
from shadow.modes.store import ModeStore
from shadow.storage import open_database

HOUR = 3600.0
BAD = {"requests": 100, "latency_over_budget": True, "imbalance_worse": False}
WORSE = {"requests": 100, "latency_over_budget": False, "imbalance_worse": True}
GOOD = {"requests": 100, "latency_over_budget": False, "imbalance_worse": False}
QUIET_BAD = {"requests": 19, "latency_over_budget": True, "imbalance_worse": True}


def live(now: float = 0.0, **changes: Any) -> FleetMode:
    state, _ = set_mode(FleetMode("f"), now, Mode.LIVE, "promote", "br0", last_gate_verdict="PASS")
    return state.copy(**changes)


def windows(state: FleetMode, t0: float, kinds: list[dict[str, Any]], **kw: Any) -> Result:
    """Feed windows one a minute from t0; return the final state and all transitions."""
    out = []
    for i, w in enumerate(kinds):
        state, ts = observe_window(state, t0 + 60 * i, **w, **kw)
        out += ts
    return state, out


# -- immediate trips ----------------------------------------------------------------


def test_immediate_trip_from_live_goes_to_fallback_with_cooldown() -> None:
    state = live()
    new, ts = trip_now(state, 100.0, "critical invariant violation: double dispatch")
    assert new.mode is Mode.FALLBACK and new.since == 100.0
    assert new.trips == [100.0] and new.cooldown_until == 100.0 + 300.0
    assert new.policy == "br0"  # kept: recovery is judged with it running in shadow
    [t] = ts
    assert (t.kind, t.from_mode, t.to_mode, t.automatic) == ("trip", Mode.LIVE, Mode.FALLBACK, True)
    assert t.details["trigger"] == "immediate" and t.details["cooldown_s"] == 300.0


def test_immediate_trip_only_from_live() -> None:
    for state in (FleetMode("f"), live().copy(mode=Mode.LATCHED)):
        new, ts = trip_now(state, 1.0, "stale telemetry")
        assert (new, ts) == (state, [])
    fallback = live().copy(mode=Mode.FALLBACK, healthy_windows=7)
    new, ts = trip_now(fallback, 1.0, "policy timeout")
    assert new.mode is Mode.FALLBACK and new.healthy_windows == 0 and ts == []
    assert new.trips == fallback.trips  # not a new trip


def test_transitions_do_not_mutate_their_input() -> None:
    state = live(recent=deque([True, True]), trips=[5.0])
    before = copy.deepcopy(state)
    trip_now(state, 10.0, "x")
    observe_window(state, 10.0, **BAD)
    assert state == before and state.recent == deque([True, True]) and state.trips == [5.0]


# -- K of the last M windows ----------------------------------------------------------


def test_trips_on_k_of_last_m_windows() -> None:
    state, ts = windows(live(), 0.0, [BAD, GOOD, WORSE])
    assert state.mode is Mode.LIVE and list(state.recent) == [True, False, True] and ts == []
    state, ts = windows(state, 1000.0, [BAD])
    assert state.mode is Mode.FALLBACK
    [t] = ts
    assert t.kind == "trip" and t.details["trigger"] == "windows"
    assert t.reason.startswith("3 of the last 4 windows unhealthy")
    assert state.recent == deque() and state.cooldown_until == 1000.0 + 300.0


def test_unhealthy_windows_older_than_m_fall_out() -> None:
    # U H H H H U U: the first U has left the last-5 window when the last U arrives.
    state, ts = windows(live(), 0.0, [BAD, GOOD, GOOD, GOOD, GOOD, BAD, WORSE])
    assert state.mode is Mode.LIVE and ts == [] and sum(state.recent) == 2
    state, ts = windows(state, 1000.0, [BAD])
    assert state.mode is Mode.FALLBACK and len(ts) == 1


def test_low_request_windows_count_neither_way() -> None:
    state, _ = windows(live(), 0.0, [BAD, BAD, QUIET_BAD, QUIET_BAD, QUIET_BAD])
    assert state.mode is Mode.LIVE and list(state.recent) == [True, True]
    # Quiet healthy windows do not push the bad ones out of the last M either.
    quiet_good = {**GOOD, "requests": 0}
    state, _ = windows(state, 1000.0, [quiet_good] * 10 + [BAD])
    assert state.mode is Mode.FALLBACK
    # Nor do they count toward recovery.
    state, _ = windows(state, 10 * HOUR, [quiet_good] * 50)
    assert state.mode is Mode.FALLBACK and state.healthy_windows == 0


def test_min_requests_is_configurable() -> None:
    cfg = ModeConfig(min_requests_per_window=0)
    state, _ = windows(live(), 0.0, [QUIET_BAD] * 3, cfg=cfg)
    assert state.mode is Mode.FALLBACK


# -- recovery -------------------------------------------------------------------------


def test_recovers_only_after_r_healthy_windows_and_cooldown() -> None:
    state, _ = trip_now(live(), 0.0, "exception")  # cooldown until 300 s
    # 11 healthy windows, then an unhealthy one: the count restarts.
    state, ts = windows(state, 400.0, [GOOD] * 11 + [BAD])
    assert state.mode is Mode.FALLBACK and state.healthy_windows == 0 and ts == []
    state, ts = windows(state, 2000.0, [GOOD] * 11)
    assert state.mode is Mode.FALLBACK and state.healthy_windows == 11 and ts == []
    state, ts = windows(state, 3000.0, [GOOD])
    assert state.mode is Mode.LIVE and state.since == 3000.0 and state.policy == "br0"
    [t] = ts
    assert (t.kind, t.from_mode, t.to_mode, t.automatic) == (
        "recover",
        Mode.FALLBACK,
        Mode.LIVE,
        True,
    )
    assert state.healthy_windows == 0 and state.cooldown_until is None
    assert state.trips == [0.0]  # kept for the 24 h latch count


def test_recovery_waits_for_the_cooldown() -> None:
    state, _ = trip_now(live(), 0.0, "exception")
    state, _ = trip_now(state.copy(mode=Mode.LIVE), 10.0, "exception")  # 2nd: 600 s
    assert state.cooldown_until == 610.0
    # 12 healthy windows, one every 10 s, all before the cooldown ends.
    for i in range(20):
        state, ts = observe_window(state, 20.0 + 10 * i, **GOOD)
        assert state.mode is Mode.FALLBACK and ts == []
    assert state.healthy_windows == 20
    state, ts = observe_window(state, 610.0, **GOOD)
    assert state.mode is Mode.LIVE and ts[0].kind == "recover"


def test_cooldown_grows_with_trips_and_is_capped() -> None:
    cfg = ModeConfig(cooldown_base_s=300.0, cooldown_max_s=1000.0, latch_trips=10)
    state = live()
    cooldowns = []
    for i in range(5):
        now = i * HOUR
        state, [t] = trip_now(state.copy(mode=Mode.LIVE), now, "x", cfg=cfg)
        assert t.kind == "trip"
        cooldowns.append(state.cooldown_until - now)  # type: ignore[operator]
    assert cooldowns == [300.0, 600.0, 900.0, 1000.0, 1000.0]


def test_recovery_windows_must_exceed_m() -> None:
    with pytest.raises(ValueError, match="recovery_windows"):
        ModeConfig(trip_m=5, recovery_windows=5)
    with pytest.raises(ValueError, match="trip_k"):
        ModeConfig(trip_k=6, trip_m=5)


# -- latching -------------------------------------------------------------------------


def _trip_cycle(state: FleetMode, now: float) -> Result:
    """Bring the fleet back to live (as a recovery would) and trip it."""
    return trip_now(state.copy(mode=Mode.LIVE), now, "exception")


def test_fourth_trip_within_24h_latches() -> None:
    state = live()
    for i in range(3):
        state, [t] = _trip_cycle(state, i * HOUR)
        assert state.mode is Mode.FALLBACK and t.kind == "trip"
    assert state.cooldown_until == 2 * HOUR + 900.0
    state, [t] = _trip_cycle(state, 23 * HOUR)
    assert state.mode is Mode.LATCHED and state.cooldown_until is None
    assert (t.kind, t.to_mode, t.automatic) == ("latch", Mode.LATCHED, True)
    assert t.details["trips_in_period"] == 4


def test_trips_older_than_24h_do_not_latch() -> None:
    state = live()
    for i in range(3):
        state, _ = _trip_cycle(state, i * HOUR)
    state, [t] = _trip_cycle(state, 24 * HOUR + 1)  # the first trip has aged out
    assert state.mode is Mode.FALLBACK and t.details["trips_in_period"] == 3
    assert state.trips == [HOUR, 2 * HOUR, 24 * HOUR + 1]  # pruned


def test_latched_stays_until_reset() -> None:
    state = live()
    for i in range(4):
        state, _ = _trip_cycle(state, i * 60.0)
    assert state.mode is Mode.LATCHED
    state, ts = windows(state, 10 * HOUR, [GOOD] * 100)
    assert state.mode is Mode.LATCHED and ts == []
    state, ts = trip_now(state, 20 * HOUR, "x")
    assert state.mode is Mode.LATCHED and ts == []
    for mode in (Mode.LIVE, Mode.FALLBACK, Mode.SHADOW):
        with pytest.raises(ModeError, match="only reset leaves latched"):
            set_mode(state, 21 * HOUR, mode, "try", last_gate_verdict="PASS")
    state, [t] = reset(state, 22 * HOUR, "root cause fixed, see INC-42")
    assert state.mode is Mode.SHADOW and state.trips == [] and state.since == 22 * HOUR
    assert (t.kind, t.from_mode, t.to_mode, t.automatic) == (
        "reset",
        Mode.LATCHED,
        Mode.SHADOW,
        False,
    )
    assert t.details["cleared_trips"] == 4


def test_reset_from_fallback_and_not_from_live() -> None:
    state, _ = trip_now(live(), 0.0, "x")
    new, _ = reset(state, 1.0, "manual")
    assert new.mode is Mode.SHADOW and new.trips == [] and new.cooldown_until is None
    with pytest.raises(ModeError, match="live"):
        reset(live(), 1.0, "manual")


# -- freezing -------------------------------------------------------------------------


def test_frozen_fleet_never_changes_mode_automatically() -> None:
    state, [t] = freeze(live(), 0.0, "investigating INC-7")
    assert state.frozen and t.kind == "freeze" and t.from_mode is t.to_mode is Mode.LIVE
    state, ts = trip_now(state, 1.0, "critical violation")
    assert state.mode is Mode.LIVE and ts == [] and state.trips == []
    state, ts = windows(state, 10.0, [BAD] * 10)
    assert state.mode is Mode.LIVE and ts == []
    # Resumed: the next unhealthy window trips on the windows counted while frozen.
    state, [t] = resume(state, 1000.0, "done")
    assert not state.frozen and t.kind == "resume"
    state, ts = observe_window(state, 1100.0, **BAD)
    assert state.mode is Mode.FALLBACK and ts[0].kind == "trip"
    # A frozen fallback never recovers, however healthy.
    state, _ = freeze(state, 1200.0, "hold")
    state, ts = windows(state, 10 * HOUR, [GOOD] * 50)
    assert state.mode is Mode.FALLBACK and ts == [] and state.healthy_windows == 50
    state, _ = resume(state, 20 * HOUR, "ok")
    state, ts = observe_window(state, 20 * HOUR + 60, **GOOD)
    assert state.mode is Mode.LIVE and ts[0].kind == "recover"


# -- operator actions -----------------------------------------------------------------


def test_promote_is_refused_after_fail() -> None:
    shadow = FleetMode("f")
    with pytest.raises(ModeError, match="promote anyway is refused after a FAIL"):
        set_mode(shadow, 0.0, Mode.LIVE, "ship it", "br0", last_gate_verdict="FAIL")
    # A stored FAIL cannot be bypassed by omitting the verdict.
    failed, ts = note_gate_verdict(shadow, 0.0, "FAIL")
    assert failed.last_gate_verdict == "FAIL" and ts == []
    with pytest.raises(ModeError, match="FAIL"):
        set_mode(failed, 0.0, "live", "ship it", "br0")
    # A newer verdict for the candidate lifts it; promote anyway is allowed otherwise.
    for verdict in ("PASS", "MARGINAL", "INCONCLUSIVE", "ERROR"):
        new, [t] = set_mode(failed, 5.0, "live", "promote anyway", "br0", last_gate_verdict=verdict)
        assert new.mode is Mode.LIVE and new.policy == "br0" and new.since == 5.0
        assert new.last_gate_verdict == verdict
        assert (t.kind, t.automatic, t.details["gate_verdict"]) == ("set_mode", False, verdict)


def test_promote_needs_a_policy() -> None:
    with pytest.raises(ModeError, match="needs a policy"):
        set_mode(FleetMode("f"), 0.0, Mode.LIVE, "go", last_gate_verdict="PASS")


def test_force_fallback_and_demote() -> None:
    state, [t] = set_mode(live(), 50.0, Mode.FALLBACK, "suspected regression")
    assert state.mode is Mode.FALLBACK and state.trips == [] and state.cooldown_until is None
    assert (t.from_mode, t.to_mode) == (Mode.LIVE, Mode.FALLBACK)
    state, _ = set_mode(state, 60.0, Mode.SHADOW, "back to observing")
    assert state.mode is Mode.SHADOW and state.policy == "br0"
    state, _ = set_mode(live(), 70.0, Mode.LATCHED, "hold Round-Robin until further notice")
    assert state.mode is Mode.LATCHED


OPERATOR_CALLS: list[Callable[[FleetMode, str], Result]] = [
    lambda s, r: set_mode(s, 0.0, Mode.SHADOW, r),
    lambda s, r: set_mode(s, 0.0, Mode.LIVE, r, "br0", last_gate_verdict="PASS"),
    lambda s, r: freeze(s, 0.0, r),
    lambda s, r: resume(s, 0.0, r),
    lambda s, r: reset(s, 0.0, r),
]


@pytest.mark.parametrize("call", OPERATOR_CALLS)
@pytest.mark.parametrize("reason", ["", "   "])
def test_every_operator_action_needs_a_reason(
    call: Callable[[FleetMode, str], Result], reason: str
) -> None:
    with pytest.raises(ValueError, match="reason"):
        call(FleetMode("f"), reason)
    _, [t] = call(FleetMode("f"), "  why  ")
    assert t.reason == "why" and not t.automatic


# -- the store ------------------------------------------------------------------------


def test_store_round_trip_and_audit(tmp_path: Path) -> None:
    path = tmp_path / "modes.duckdb"
    with open_database(path) as db:
        store = ModeStore(db.engine)
        assert store.get("a") == FleetMode("a")
        state, [t] = store.apply(
            "a", set_mode, "live", "gate passed", "br0", actor="alice", now=10.0,
            last_gate_verdict="PASS",
        )  # fmt: skip
        assert store.get("a") == state and state.mode is Mode.LIVE
        store.apply("a", observe_window, actor="svc", now=20.0, **BAD)
        store.apply("a", observe_window, actor="svc", now=30.0, **WORSE)
        assert list(store.get("a").recent) == [True, True]
        store.apply("a", freeze, "look", actor="bob", now=40.0)
        store.apply("a", resume, "looked", actor="bob", now=50.0)
        state, [t] = store.apply("a", observe_window, actor="svc", now=60.0, **BAD)
        assert t.kind == "trip" and store.get("a") == state
        store.apply("b", freeze, "new fleet", actor="carol", now=70.0)
    # Everything survives a reopen.
    with open_database(path) as db:
        store = ModeStore(db.engine)
        a = store.get("a")
        assert a == state and a.mode is Mode.FALLBACK and a.cooldown_until == 360.0
        assert a.trips == [60.0] and a.last_gate_verdict == "PASS" and a.policy == "br0"
        assert [s.fleet for s in store.all()] == ["a", "b"] and store.get("b").frozen
        log = list(reversed(auditlog.entries(db.engine)))
        assert [(e.fleet, e.kind, e.actor) for e in log] == [
            ("a", "operator_action", "alice"),
            ("a", "operator_action", "bob"),
            ("a", "operator_action", "bob"),
            ("a", "mode_transition", "svc"),
            ("b", "operator_action", "carol"),
        ]
        assert log[0].payload["to"] == "live" and log[0].reason == "gate passed"
        assert log[3].payload["transition"] == "trip" and log[3].ts == 60.0
        assert log[3].payload["details"]["window"]["latency_over_budget"] is True
        assert auditlog.verify(db.engine) == auditlog.VerifyResult(True, 5)


def test_store_refused_action_is_audited_and_changes_nothing(tmp_path: Path) -> None:
    with open_database(tmp_path / "m.duckdb") as db:
        store = ModeStore(db.engine)
        store.apply("a", note_gate_verdict, "FAIL", actor="gate", now=1.0)
        before = store.get("a")
        with pytest.raises(ModeError, match="FAIL"):
            store.apply("a", set_mode, "live", "ship it", "br0", actor="mallory", now=2.0)
        assert store.get("a") == before
        [entry] = auditlog.entries(db.engine)
        assert (entry.kind, entry.actor, entry.reason) == ("operator_action", "mallory", "ship it")
        assert entry.payload["refused"] is True and entry.payload["action"] == "set_mode"
        assert entry.payload["policy"] == "br0" and "FAIL" in entry.payload["error"]
        # A missing reason is a usage error, not an action: nothing is written.
        with pytest.raises(ValueError, match="reason"):
            store.apply("a", freeze, "", actor="mallory", now=3.0)
        assert len(auditlog.entries(db.engine)) == 1
        assert auditlog.verify(db.engine).ok


def test_store_rolls_back_state_when_audit_fails(tmp_path: Path) -> None:
    """State and audit rows commit together: a failing append leaves the old state."""
    with open_database(tmp_path / "m.duckdb") as db:
        store = ModeStore(db.engine)

        def bad_details(state: FleetMode, now: float) -> Result:
            new, ts = freeze(state, now, "x")
            ts[0].details["oops"] = float("nan")  # not JSON: the audit append raises
            return new, ts

        with pytest.raises(ValueError):
            store.apply("a", bad_details, actor="x", now=1.0)
        assert store.get("a") == FleetMode("a")
        assert store.all() == [] and auditlog.entries(db.engine) == []


def test_store_apply_needs_an_actor(tmp_path: Path) -> None:
    with open_database(tmp_path / "m.duckdb") as db, pytest.raises(ValueError, match="actor"):
        ModeStore(db.engine).apply("a", freeze, "x", actor="", now=1.0)
