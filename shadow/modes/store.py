"""The ``fleet_modes`` table: each fleet's mode state, saved with one audit row per
transition in the same transaction (the I/O half of the mode machine in ``machine.py``)."""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from shadow.modes import auditlog
from shadow.modes.machine import OPERATOR_ACTIONS, FleetMode, Mode, ModeError, Result, Transition
from shadow.storage.models import FleetModeRow

_TABLE = FleetModeRow.__table__


def _to_row(state: FleetMode, updated_at: float) -> dict[str, Any]:
    return {
        "fleet": state.fleet,
        "mode": state.mode.value,
        "policy": state.policy,
        "since": float(state.since),
        "trips_json": json.dumps([float(t) for t in state.trips]),
        "recent_json": json.dumps([bool(b) for b in state.recent]),
        "healthy_windows": int(state.healthy_windows),
        "frozen": bool(state.frozen),
        "cooldown_until": state.cooldown_until,
        "last_gate_verdict": state.last_gate_verdict,
        "updated_at": float(updated_at),
    }


def _from_row(row: Any) -> FleetMode:
    return FleetMode(
        fleet=row["fleet"],
        mode=Mode(row["mode"]),
        policy=row["policy"],
        since=float(row["since"]),
        trips=[float(t) for t in json.loads(row["trips_json"])],
        recent=deque(bool(b) for b in json.loads(row["recent_json"] or "[]")),
        healthy_windows=int(row["healthy_windows"]),
        frozen=bool(row["frozen"]),
        cooldown_until=None if row["cooldown_until"] is None else float(row["cooldown_until"]),
        last_gate_verdict=row["last_gate_verdict"],
    )


class ModeStore:
    """The ``fleet_modes`` table, with every change audited in the same transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Serialises apply() in this process: two concurrent read-modify-writes of one
        # fleet would otherwise make DuckDB abort one of them with a write conflict.
        self._lock = threading.RLock()

    def get(self, fleet: str, conn: Connection | None = None) -> FleetMode:
        """The fleet's state; a fleet never saved is in ``shadow``."""
        if conn is None:
            with self.engine.connect() as own:
                return self.get(fleet, own)
        row = conn.execute(select(_TABLE).where(_TABLE.c.fleet == fleet)).mappings().first()
        return FleetMode(fleet=fleet) if row is None else _from_row(row)

    def all(self) -> list[FleetMode]:
        """Every saved fleet, by name."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(_TABLE).order_by(_TABLE.c.fleet)).mappings().all()
        return [_from_row(r) for r in rows]

    def save(self, conn: Connection, state: FleetMode, *, now: float | None = None) -> None:
        """Upsert ``state`` in the caller's transaction (``now`` stamps ``updated_at``)."""
        values = _to_row(state, time.time() if now is None else now)
        exists = conn.execute(select(_TABLE.c.fleet).where(_TABLE.c.fleet == state.fleet)).first()
        if exists is None:
            conn.execute(insert(_TABLE).values(**values))
        else:
            fleet = values.pop("fleet")
            conn.execute(update(_TABLE).where(_TABLE.c.fleet == fleet).values(**values))

    def apply(
        self,
        fleet: str,
        fn: Callable[..., Result],
        /,
        *args: Any,
        actor: str,
        now: float | None = None,
        **kwargs: Any,
    ) -> Result:
        """Load, ``fn(state, now, *args, **kwargs)``, save and audit, in one transaction.

        Each Transition becomes one audit row (``operator_action`` for operator calls,
        ``mode_transition`` otherwise). An operator action the rules refuse
        (:class:`ModeError`) is audited as refused, then re-raised; nothing else is
        written. ``now`` defaults to the clock.
        """
        if not actor:
            raise ValueError("apply needs a non-empty actor")
        at = time.time() if now is None else float(now)
        with self._lock:
            try:
                with self.engine.begin() as conn:
                    state = self.get(fleet, conn)
                    new, transitions = fn(state, at, *args, **kwargs)
                    if new.fleet != fleet:
                        raise ValueError(f"{fn.__name__} changed the fleet to {new.fleet!r}")
                    self.save(conn, new, now=at)
                    for t in transitions:
                        auditlog.append(
                            conn,
                            ts=at,
                            fleet=fleet,
                            kind=(
                                auditlog.KIND_MODE_TRANSITION
                                if t.automatic
                                else auditlog.KIND_OPERATOR_ACTION
                            ),
                            actor=actor,
                            reason=t.reason,
                            payload=_payload(t, new),
                        )
            except ModeError as exc:
                if fn in OPERATOR_ACTIONS:
                    self._audit_refusal(fleet, fn, at, actor, exc, args, kwargs)
                raise
        return new, transitions

    def _audit_refusal(
        self,
        fleet: str,
        fn: Callable[..., Result],
        now: float,
        actor: str,
        exc: ModeError,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """A refused operator action is still an operator action: one audit row."""
        bound = inspect.signature(fn).bind(None, now, *args, **kwargs).arguments
        request = {k: str(v) for k, v in bound.items() if k not in ("state", "now", "reason")}
        auditlog.append(
            self.engine,
            ts=now,
            fleet=fleet,
            kind=auditlog.KIND_OPERATOR_ACTION,
            actor=actor,
            reason=str(bound.get("reason")),
            payload={"action": fn.__name__, "refused": True, "error": str(exc), **request},
        )


def _payload(t: Transition, new: FleetMode) -> dict[str, Any]:
    return {
        "transition": t.kind,
        "from": t.from_mode.value,
        "to": t.to_mode.value,
        "policy": new.policy,
        "frozen": new.frozen,
        "details": t.details,
    }
