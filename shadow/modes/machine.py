"""Per-fleet mode state machine of GATE.md ("Modes and automatic fallback").

``shadow`` (observe only) -> ``live`` (the promoted policy answers ``/v1/route``) ->
``fallback`` (Round-Robin answers; it needs no load telemetry, so it is the safe mode) ->
``latched`` (Round-Robin until an operator resets).

The transition functions are pure: they take a :class:`FleetMode` and return a new one
plus the :class:`Transition` records to audit, never mutating their input, so the rules
can be tested without a clock or a database. ``shadow.modes.store.ModeStore`` persists
the state and writes one audit row per transition in the same transaction.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class Mode(StrEnum):
    """Who answers ``/v1/route`` for a fleet."""

    SHADOW = "shadow"
    LIVE = "live"
    FALLBACK = "fallback"
    LATCHED = "latched"


class ModeError(ValueError):
    """A transition the rules refuse (e.g. promoting after a FAIL, leaving ``latched``)."""


AUTOMATIC_KINDS = frozenset({"trip", "latch", "recover"})
"""Transition kinds the machine takes by itself (audited as ``mode_transition``)."""
OPERATOR_KINDS = frozenset({"set_mode", "freeze", "resume", "reset"})
"""Transition kinds an operator asks for (audited as ``operator_action``)."""


@dataclass(frozen=True, slots=True)
class ModeConfig:
    """Thresholds of the machine (GATE.md defaults)."""

    trip_k: int = 3
    """Trip when at least ``trip_k`` of the last ``trip_m`` counted windows were unhealthy."""
    trip_m: int = 5
    min_requests_per_window: int = 20
    """Windows with fewer requests count neither way (too noisy to judge)."""
    recovery_windows: int = 12
    """Consecutive healthy windows needed to leave ``fallback`` (must exceed ``trip_m``)."""
    cooldown_base_s: float = 300.0
    cooldown_max_s: float = 3600.0
    latch_trips: int = field(default=3, metadata={"ge": 1})
    """More than this many trips within ``latch_period_s`` latches (``metadata``: the bound
    a configured value must meet; the machine itself also takes 0, latch at the first)."""
    latch_period_s: float = 86400.0

    def __post_init__(self) -> None:
        if not 1 <= self.trip_k <= self.trip_m:
            raise ValueError(f"need 1 <= trip_k <= trip_m, got {self.trip_k}, {self.trip_m}")
        if self.recovery_windows <= self.trip_m:
            # Recovering faster than a trip can be decided would let a flapping policy
            # oscillate between live and fallback.
            raise ValueError(
                f"recovery_windows ({self.recovery_windows}) must exceed trip_m ({self.trip_m})"
            )
        if self.min_requests_per_window < 0:
            raise ValueError("min_requests_per_window must be >= 0")
        if not 0 <= self.cooldown_base_s <= self.cooldown_max_s:
            raise ValueError("need 0 <= cooldown_base_s <= cooldown_max_s")
        if self.latch_trips < 0 or self.latch_period_s <= 0:
            raise ValueError("need latch_trips >= 0 and latch_period_s > 0")


DEFAULT_CONFIG = ModeConfig()


@dataclass(frozen=True, slots=True)
class FleetMode:
    """The state of one fleet. Treat as immutable: transitions return a copy."""

    fleet: str
    mode: Mode = Mode.SHADOW
    policy: str | None = None
    """The promoted policy (``live``), kept in ``fallback`` to judge recovery in shadow."""
    since: float = 0.0
    """When the fleet entered ``mode`` (0.0: never changed)."""
    trips: list[float] = field(default_factory=list)
    """Trip timestamps within the latch period (older ones are pruned at each trip)."""
    recent: deque[bool] = field(default_factory=deque)
    """Outcomes of the last counted windows in ``live``, oldest first (True = unhealthy)."""
    healthy_windows: int = 0
    """Consecutive healthy counted windows in ``fallback``."""
    frozen: bool = False
    """An operator froze the fleet: no automatic mode change."""
    cooldown_until: float | None = None
    last_gate_verdict: str | None = None

    def copy(self, **changes: Any) -> FleetMode:
        """A copy with fresh containers, so no two states share a list or deque."""
        changes.setdefault("trips", list(self.trips))
        changes.setdefault("recent", deque(self.recent))
        return replace(self, **changes)

    def trips_within(self, now: float, cfg: ModeConfig = DEFAULT_CONFIG) -> list[float]:
        """Trips in the latch period ending at ``now``."""
        return [t for t in self.trips if now - t < cfg.latch_period_s]


@dataclass(frozen=True, slots=True)
class Transition:
    """One change to audit; ``from_mode == to_mode`` for freeze/resume and no-op sets."""

    kind: str
    from_mode: Mode
    to_mode: Mode
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def automatic(self) -> bool:
        """Taken by the machine (``mode_transition``), not asked for by an operator."""
        return self.kind in AUTOMATIC_KINDS


Result = tuple[FleetMode, list[Transition]]


def _require_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("a non-empty reason is required")
    return reason.strip()


def _trip(state: FleetMode, now: float, reason: str, cfg: ModeConfig, trigger: str) -> Result:
    """Leave ``live``: to ``fallback`` with a growing cooldown, or to ``latched``."""
    trips = [*state.trips_within(now, cfg), now]
    n = len(trips)
    details: dict[str, Any] = {"trigger": trigger, "trips_in_period": n, "policy": state.policy}
    if n > cfg.latch_trips:
        details["latch_trips"] = cfg.latch_trips
        new = state.copy(
            mode=Mode.LATCHED,
            since=now,
            trips=trips,
            recent=deque(),
            healthy_windows=0,
            cooldown_until=None,
        )
        return new, [Transition("latch", state.mode, Mode.LATCHED, reason, details)]
    cooldown = min(cfg.cooldown_base_s * n, cfg.cooldown_max_s)
    details |= {"cooldown_s": cooldown, "cooldown_until": now + cooldown}
    new = state.copy(
        mode=Mode.FALLBACK,
        since=now,
        trips=trips,
        recent=deque(),
        healthy_windows=0,
        cooldown_until=now + cooldown,
    )
    return new, [Transition("trip", state.mode, Mode.FALLBACK, reason, details)]


def trip_now(
    state: FleetMode, now: float, reason: str, *, cfg: ModeConfig = DEFAULT_CONFIG
) -> Result:
    """An immediate trip: critical invariant violation, policy exception or timeout, stale
    telemetry.

    Only ``live`` trips (and not when frozen). In ``fallback`` the same event, seen with
    the policy running in shadow, restarts the healthy-window count: a policy that throws
    must not recover.
    """
    reason = _require_reason(reason)
    if state.mode is Mode.LIVE and not state.frozen:
        return _trip(state, now, reason, cfg, "immediate")
    if state.mode is Mode.FALLBACK:
        return state.copy(healthy_windows=0), []
    return state.copy(), []


def observe_window(
    state: FleetMode,
    now: float,
    *,
    requests: int,
    latency_over_budget: bool,
    imbalance_worse: bool,
    cfg: ModeConfig = DEFAULT_CONFIG,
) -> Result:
    """Judge one closed window (in ``fallback``, judged with the policy in shadow).

    ``live``: trip when >= K of the last M counted windows were unhealthy. ``fallback``:
    recover after R consecutive healthy windows and once the cooldown is over. Windows
    with fewer than ``min_requests_per_window`` requests change nothing. A frozen fleet
    keeps counting but never changes mode.
    """
    if requests < 0:
        raise ValueError(f"requests must be >= 0, got {requests}")
    if requests < cfg.min_requests_per_window or state.mode not in (Mode.LIVE, Mode.FALLBACK):
        return state.copy(), []
    unhealthy = bool(latency_over_budget or imbalance_worse)
    window = {
        "requests": requests,
        "latency_over_budget": bool(latency_over_budget),
        "imbalance_worse": bool(imbalance_worse),
    }
    if state.mode is Mode.LIVE:
        recent = deque(state.recent, maxlen=cfg.trip_m)
        recent.append(unhealthy)
        new = state.copy(recent=deque(recent))
        bad = sum(recent)
        if unhealthy and bad >= cfg.trip_k and not state.frozen:
            causes = [k for k in ("latency_over_budget", "imbalance_worse") if window[k]]
            reason = (
                f"{bad} of the last {len(recent)} windows unhealthy "
                f"(threshold {cfg.trip_k} of {cfg.trip_m}; latest: {', '.join(causes)})"
            )
            new, transitions = _trip(new, now, reason, cfg, "windows")
            transitions[0].details["window"] = window
            return new, transitions
        return new, []
    # fallback
    healthy = 0 if unhealthy else state.healthy_windows + 1
    new = state.copy(healthy_windows=healthy)
    cooled = state.cooldown_until is None or now >= state.cooldown_until
    if healthy >= cfg.recovery_windows and cooled and not state.frozen and state.policy is not None:
        reason = (
            f"{healthy} consecutive healthy windows (need {cfg.recovery_windows}) and cooldown over"
        )
        details = {"healthy_windows": healthy, "cooldown_until": state.cooldown_until}
        recovered = new.copy(
            mode=Mode.LIVE, since=now, recent=deque(), healthy_windows=0, cooldown_until=None
        )
        return recovered, [Transition("recover", Mode.FALLBACK, Mode.LIVE, reason, details)]
    return new, []


def set_mode(
    state: FleetMode,
    now: float,
    mode: Mode | str,
    reason: str,
    policy: str | None = None,
    *,
    last_gate_verdict: str | None = None,
) -> Result:
    """Operator: put the fleet in ``mode`` (promote, force fallback, demote, latch).

    Promoting to ``live`` needs a policy (``policy`` or the one kept in the state) and is
    refused after a FAIL verdict ("promote anyway" covers INCONCLUSIVE, MARGINAL, ERROR or
    no gate run, never FAIL). ``last_gate_verdict`` is the verdict of the gate run for the
    policy being promoted; None falls back to the state's stored verdict, so a stored
    FAIL cannot be bypassed by omitting it. ``latched`` is left only by :func:`reset`.
    A forced ``fallback`` recovers automatically like a trip's; to hold it, latch or
    freeze.
    """
    reason = _require_reason(reason)
    target = Mode(mode)
    verdict = last_gate_verdict if last_gate_verdict is not None else state.last_gate_verdict
    if state.mode is Mode.LATCHED and target is not Mode.LATCHED:
        raise ModeError(f"fleet {state.fleet!r} is latched: only reset leaves latched")
    new_policy = policy if policy is not None else state.policy
    details: dict[str, Any] = {"requested": target.value, "gate_verdict": verdict}
    if target is Mode.LIVE:
        if new_policy is None:
            raise ModeError(f"fleet {state.fleet!r}: promoting to live needs a policy")
        if verdict is not None and verdict.strip().upper() == "FAIL":
            raise ModeError(
                f"fleet {state.fleet!r}: the last gate verdict for {new_policy!r} is FAIL; "
                "promote anyway is refused after a FAIL"
            )
        details["policy"] = new_policy
    changes: dict[str, Any] = {"mode": target, "policy": new_policy, "last_gate_verdict": verdict}
    if target is not state.mode:
        changes["since"] = now
    if target is not state.mode or new_policy != state.policy:
        # A new mode (or a new live policy) starts with a clean window history.
        changes |= {"recent": deque(), "healthy_windows": 0, "cooldown_until": None}
    new = state.copy(**changes)
    return new, [Transition("set_mode", state.mode, target, reason, details)]


def freeze(state: FleetMode, now: float, reason: str) -> Result:
    """Operator: stop automatic mode changes (windows are still counted)."""
    reason = _require_reason(reason)
    return state.copy(frozen=True), [
        Transition("freeze", state.mode, state.mode, reason, {"was_frozen": state.frozen})
    ]


def resume(state: FleetMode, now: float, reason: str) -> Result:
    """Operator: undo :func:`freeze`; automatic changes resume at the next judgement."""
    reason = _require_reason(reason)
    return state.copy(frozen=False), [
        Transition("resume", state.mode, state.mode, reason, {"was_frozen": state.frozen})
    ]


def reset(state: FleetMode, now: float, reason: str) -> Result:
    """Operator: ``latched`` / ``fallback`` (or ``shadow``) -> ``shadow``, clearing trips.

    Refused from ``live``: clearing trips there would erase the latch history of a running
    policy; demote with :func:`set_mode` first.
    """
    reason = _require_reason(reason)
    if state.mode is Mode.LIVE:
        raise ModeError(f"fleet {state.fleet!r} is live: set_mode to shadow before reset")
    details = {"cleared_trips": len(state.trips)}
    new = state.copy(
        mode=Mode.SHADOW,
        since=now if state.mode is not Mode.SHADOW else state.since,
        trips=[],
        recent=deque(),
        healthy_windows=0,
        cooldown_until=None,
    )
    return new, [Transition("reset", state.mode, Mode.SHADOW, reason, details)]


def note_gate_verdict(state: FleetMode, now: float, verdict: str) -> Result:
    """Remember the latest gate verdict (the gate run itself is audited as ``gate_run``)."""
    return state.copy(last_gate_verdict=verdict), []


OPERATOR_ACTIONS: frozenset[Callable[..., Result]] = frozenset({set_mode, freeze, resume, reset})
