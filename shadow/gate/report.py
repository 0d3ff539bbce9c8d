"""The gate's report: one row per metric, the verdict and its exit code, the `--json`
document (schema versioned, NaN as null, a config hash) and the `--explain` text. Kept
apart from the rules in `verdict`, so what a report is and how it is judged are read one
at a time."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from shadow.gate.evidence import Evidence
from shadow.gate.statistics import BootstrapResult, histogram_text
from shadow.gate.thresholds import GATE_METRICS, Thresholds

SCHEMA_VERSION = 1


EXIT_CODES = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3, "MARGINAL": 4, "ERROR": 5}


USAGE_EXIT_CODE = 2


ROLES = {
    "critical_violations": "HARD",
    "candidate_errors": "HARD",
    "decision_latency_p99_ms": "HARD",
    "throughput_ratio": "PRIMARY",
    "tpot_p95_ratio": "PRIMARY",
    "imbalance_ratio": "OBJECTIVE",
    "replay_fidelity": "GUARD",
    "predictor_calibration": "GUARD",
    "noise_floor": "NOISE",
    "evidence": "EVIDENCE",
}


@dataclass(frozen=True)
class MetricRow:
    """One line of the gate table: what was measured, against which margin, and the outcome.

    `margin` is the rule in words (e.g. ">= 0.99"); `label` the outcome ("pass", "fail",
    "straddles", "missing", "not shown", "out of bounds", "n/a", "dry run", ...); `rule`
    the evaluation with its numbers.
    """

    metric: str
    role: str
    n: int
    incumbent: float | None
    candidate: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    margin: str
    label: str
    rule: str
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True, eq=False)
class GateReport:
    """The verdict, its exit code, the one sentence that explains it, and every row."""

    verdict: str
    exit_code: int
    deciding_rule: str
    rows: tuple[MetricRow, ...]
    bootstrap: dict[str, BootstrapResult]
    evidence: Evidence
    thresholds: Thresholds

    def row(self, metric: str) -> MetricRow:
        for row in self.rows:
            if row.metric == metric:
                return row
        raise KeyError(metric)

    def exit_code_for(self, *, allow_marginal: bool = False, dry_run: bool = False) -> int:
        """The process exit code under `--allow-marginal` / `--dry-run` (GATE.md)."""
        if dry_run or (allow_marginal and self.verdict == "MARGINAL"):
            return 0
        return self.exit_code

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of what configures the run (not of the evidence)."""
        ev = self.evidence
        config = {
            "thresholds": self.thresholds.as_dict(),
            "candidate": ev.candidate,
            "baseline": ev.baseline,
            "fleet": ev.fleet,
            "since": ev.since,
            "until": ev.until,
        }
        return hashlib.sha256(_canonical(config).encode()).hexdigest()

    def as_json(self, tool_version: str) -> dict[str, Any]:
        """The `--json` document (schema 1); only plain JSON types, NaN as null."""
        ev = self.evidence
        return {
            "schema": SCHEMA_VERSION,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "deciding_rule": self.deciding_rule,
            "rows": [row.as_dict() for row in self.rows],
            "bootstrap": {
                name: _jsonable(
                    {
                        "point": b.point,
                        "ci_low": b.ci_low,
                        "ci_high": b.ci_high,
                        "n": b.n,
                        "dropped": b.dropped,
                    }
                )
                for name, b in sorted(self.bootstrap.items())
            },
            "evidence": _jsonable(
                {
                    "fleet": ev.fleet,
                    "candidate": ev.candidate,
                    "baseline": ev.baseline,
                    "since": ev.since,
                    "until": ev.until,
                    "windows": len(ev.windows),
                    "decisions": ev.decisions,
                    "dispatches": ev.dispatches,
                    "audited_share": ev.audited_share,
                    "critical_violations": ev.critical_violations,
                    "candidate_errors": ev.candidate_errors,
                    "decision_latency_p99_ms": ev.decision_latency_p99_ms,
                    "step_ms_mean": ev.step_ms_mean,
                    "calibration_auc": ev.calibration_auc,
                }
            ),
            "thresholds": self.thresholds.as_dict(),
            "evidence_ids": _jsonable(ev.evidence_ids),
            "tool_version": tool_version,
            "config_hash": self.config_hash(),
            "disagreements": _jsonable(list(ev.disagreements)),
        }


def explain(report: GateReport, metric: str) -> str:
    """`--explain METRIC`: the rule evaluation and, for interval rules, the bootstrap."""
    names = [row.metric for row in report.rows]
    if metric not in names:
        known = ", ".join(names or GATE_METRICS)
        raise ValueError(f"unknown metric {metric!r}; known: {known}")
    row = report.row(metric)
    t = report.thresholds
    lines = [
        f"{row.metric} ({row.role}){' [dry run: never decides]' if row.dry_run else ''}",
        f"  margin:  {row.margin}",
        f"  outcome: {row.label}",
        f"  rule:    {row.rule}",
        f"  n:       {row.n}",
    ]
    if row.incumbent is not None or row.candidate is not None:
        means = f"incumbent mean: {fmt(row.incumbent)}, candidate mean: {fmt(row.candidate)}"
        lines.append(f"  {means}")
    keys = [k for k in sorted(report.bootstrap) if k == metric or k.startswith(metric + ".")]
    if not keys:
        lines.append("  (no bootstrap: this rule is not judged on an interval)")
    for key in keys:
        b = report.bootstrap[key]
        lines.append("")
        statistic = next(
            (text for name, text in _STATISTICS.items() if name in key), "ratio of means"
        )
        lines.append(
            f"bootstrap {key}: {statistic} {fmt(b.point)} "
            f"[{fmt(b.ci_low)}, {fmt(b.ci_high)}] over {b.n} windows ({b.dropped} dropped), "
            f"{t.bootstrap_resamples} resamples, {t.confidence:.0%} percentile interval, "
            f"seed {t.seed}"
        )
        lines.append(histogram_text(b.samples))
    return "\n".join(lines)


#: what each bootstrap's ratio is a ratio of (GATE.md: the quantity the full replay measures)
_STATISTICS = {
    "throughput": "ratio of tokens over busy time",
    "tpot": "ratio of the P95 over the windows' requests pooled",
    "imbalance": "ratio of the mean over steps",
}


def fmt(x: float | None) -> str:
    """A value as the report prints it: three places, n/a when unknown."""
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def _jsonable(value: Any) -> Any:
    """Plain JSON types only; NaN and infinities as null so the output is strict JSON."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=_canonical) if isinstance(value, set | frozenset) else items
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    return str(value)


def _canonical(value: Any) -> str:
    return json.dumps(_jsonable(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
