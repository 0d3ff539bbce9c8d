"""Modes and automatic fallback (GATE.md): the per-fleet mode machine (pure, `machine`),
its DuckDB store (`store`) and the hash-chained audit log (`auditlog`).

`ModeStore` is imported on first use, so that importing the pure machine (this package
included) never loads the storage layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shadow.modes.machine import (
    AUTOMATIC_KINDS,
    DEFAULT_CONFIG,
    OPERATOR_ACTIONS,
    OPERATOR_KINDS,
    FleetMode,
    Mode,
    ModeConfig,
    ModeError,
    Result,
    Transition,
    freeze,
    note_gate_verdict,
    observe_window,
    reset,
    resume,
    set_mode,
    trip_now,
)

if TYPE_CHECKING:
    from shadow.modes.store import ModeStore


def __getattr__(name: str) -> Any:
    if name == "ModeStore":
        from shadow.modes.store import ModeStore

        return ModeStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTOMATIC_KINDS",
    "DEFAULT_CONFIG",
    "OPERATOR_ACTIONS",
    "OPERATOR_KINDS",
    "FleetMode",
    "Mode",
    "ModeConfig",
    "ModeError",
    "ModeStore",
    "Result",
    "Transition",
    "freeze",
    "note_gate_verdict",
    "observe_window",
    "reset",
    "resume",
    "set_mode",
    "trip_now",
]
