"""The gate's thresholds: GATE.md's defaults, overridable from a flat TOML file.

Strict on purpose: a misspelt key silently falling back to a default would change a
verdict without anyone noticing, so unknown keys and wrong types are errors.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

GATE_METRICS = (
    "critical_violations",
    "candidate_errors",
    "decision_latency_p99_ms",
    "throughput_ratio",
    "tpot_p95_ratio",
    "imbalance_ratio",
    "replay_fidelity",
    "predictor_calibration",
    "noise_floor",
    "evidence",
)

_INT_FIELDS = frozenset(
    {
        "critical_violations_max",
        "candidate_errors_max",
        "min_windows",
        "min_decisions",
        "bootstrap_resamples",
        "bootstrap_block_windows",
        "warmup_windows",
        "seed",
    }
)

_DOCS = {
    "critical_violations_max": "HARD: critical invariant violations allowed",
    "candidate_errors_max": "HARD: candidate decision errors / timeouts allowed",
    "decision_latency_p99_ms_max": "HARD: candidate decision latency P99 cap (ms)",
    "decision_latency_step_fraction_max": "HARD: latency P99 <= this x measured step time",
    "throughput_ratio_ci_low_min": "PRIMARY: throughput ratio lower CI bound >= this",
    "tpot_p95_ratio_ci_high_max": "PRIMARY: TPOT P95 ratio upper CI bound <= this",
    "imbalance_ratio_ci_high_max": "OBJECTIVE: imbalance ratio upper CI bound < this",
    "fidelity_tolerance": "GUARD: replayed incumbent within this of observed (relative)",
    "fidelity_window_share_min": "GUARD: share of windows within the fidelity tolerance",
    "calibration_auc_min": "GUARD: predictor AUC >= this",
    "min_windows": "evidence: paired windows needed",
    "min_decisions": "evidence: audited decisions needed",
    "bootstrap_resamples": "bootstrap resamples over windows",
    "bootstrap_block_windows": "continuous windows: consecutive windows resampled together",
    "warmup_windows": "continuous windows: dropped after each start of the runs",
    "confidence": "confidence level of the bootstrap intervals",
    "seed": "bootstrap seed (same evidence, same verdict)",
    "dry_run": "metrics computed and printed but never deciding",
}


class ThresholdsError(ValueError):
    """A thresholds file or value the gate refuses (a usage error, exit 2)."""


@dataclass(frozen=True)
class Thresholds:
    """Margins and evidence minimums of the gate (defaults from GATE.md)."""

    critical_violations_max: int = 0
    candidate_errors_max: int = 0
    decision_latency_p99_ms_max: float = 5.0
    decision_latency_step_fraction_max: float = 0.1
    throughput_ratio_ci_low_min: float = 0.99
    tpot_p95_ratio_ci_high_max: float = 1.05
    imbalance_ratio_ci_high_max: float = 1.0
    fidelity_tolerance: float = 0.10
    fidelity_window_share_min: float = 0.90
    calibration_auc_min: float = 0.7
    min_windows: int = 30
    min_decisions: int = 2000
    bootstrap_resamples: int = 10_000
    #: a continuous run's neighbouring windows share requests (a long one lives for
    #: minutes): blocks of this many consecutive windows are resampled together
    bootstrap_block_windows: int = 4
    #: windows after each start of the continuous runs left out: the fleet the candidate
    #: inherited from the incumbent must drain first
    warmup_windows: int = 4
    confidence: float = 0.95
    seed: int = 0
    dry_run: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for f in fields(self):
            name, value = f.name, getattr(self, f.name)
            if name == "dry_run":
                object.__setattr__(self, name, _dry_run(value))
            elif name in _INT_FIELDS:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ThresholdsError(
                        f"threshold {name} must be an integer, got {type(value).__name__} {value!r}"
                    )
                if value < 0:
                    raise ThresholdsError(f"threshold {name} must be >= 0, got {value}")
            else:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ThresholdsError(
                        f"threshold {name} must be a number, got {type(value).__name__} {value!r}"
                    )
                if math.isnan(value):
                    raise ThresholdsError(f"threshold {name} must not be NaN")
                object.__setattr__(self, name, float(value))
        if self.bootstrap_resamples < 1:
            raise ThresholdsError("threshold bootstrap_resamples must be >= 1")
        if not 0.0 < self.confidence < 1.0:
            raise ThresholdsError(f"threshold confidence must be in (0, 1), got {self.confidence}")
        if not 0.0 <= self.fidelity_window_share_min <= 1.0:
            raise ThresholdsError("threshold fidelity_window_share_min must be in [0, 1]")
        for name in ("fidelity_tolerance", "decision_latency_p99_ms_max"):
            if getattr(self, name) < 0:
                raise ThresholdsError(f"threshold {name} must be >= 0")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (dry_run as a sorted list), in field order."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = sorted(value) if f.name == "dry_run" else value
        return out

    def as_toml(self) -> str:
        """The effective thresholds as a TOML file `load_thresholds` reads back unchanged."""
        lines = ["# balanceroute-shadow promotion gate thresholds (GATE.md)"]
        for name, value in self.as_dict().items():
            lines.append(f"# {_DOCS[name]}")
            lines.append(f"{name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def thresholds_from_mapping(data: dict[str, Any]) -> Thresholds:
    """Defaults overridden by `data`; unknown keys are an error naming them."""
    known = {f.name for f in fields(Thresholds)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ThresholdsError(
            f"unknown threshold key(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    return Thresholds(**data)


def load_thresholds(path: str | Path) -> Thresholds:
    """Read a flat TOML file of `key = value` overrides (see `Thresholds.as_toml`)."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdsError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ThresholdsError(f"{path}: cannot read thresholds: {exc}") from exc
    try:
        return thresholds_from_mapping(data)
    except ThresholdsError as exc:
        raise ThresholdsError(f"{path}: {exc}") from exc


def _dry_run(value: Any) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise ThresholdsError(
            f"threshold dry_run must be a list of metric names, got {type(value).__name__}"
        )
    bad_types = [v for v in value if not isinstance(v, str)]
    if bad_types:
        raise ThresholdsError(f"threshold dry_run must hold strings, got {bad_types!r}")
    unknown = sorted(set(value) - set(GATE_METRICS))
    if unknown:
        raise ThresholdsError(
            f"unknown dry_run metric(s): {', '.join(unknown)} (known: {', '.join(GATE_METRICS)})"
        )
    return frozenset(value)


def _toml_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)
