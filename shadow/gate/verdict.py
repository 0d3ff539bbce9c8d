"""The promotion gate's decision: one row per metric with a role, one verdict, one reason.

Pure and deterministic: the same evidence and thresholds give the same report, byte for
byte once dumped as JSON with sorted keys. Roles instead of a blended score (a weighted
score can hide a regression), margins on bootstrap intervals instead of p-values, and no
data is never a pass (GATE.md).

Rules (exact):

- HARD `critical_violations`, `candidate_errors`: count <= the allowed maximum.
- HARD `decision_latency_p99_ms`: P99 <= `decision_latency_p99_ms_max` and, when the
  measured step time is known, P99 <= `decision_latency_step_fraction_max` x step time.
  Unknown latency is missing evidence (INCONCLUSIVE), never a pass.
- PRIMARY `throughput_ratio` (candidate / incumbent `throughput_tok_s`): pass when the CI
  low >= margin, FAIL when the CI high < margin, else it straddles (INCONCLUSIVE).
- PRIMARY `tpot_p95_ratio` (`tpot_p95_ms`): pass when the CI high <= margin, FAIL when the
  CI low > margin, else it straddles (INCONCLUSIVE).
- Both PRIMARY intervals are judged widened on each side by the A/A deviation d =
  |A/A ratio - 1| of the same metric (the incumbent against itself with other
  tie-breaks): a difference the incumbent makes against itself is never called for or
  against the candidate.
- OBJECTIVE `imbalance_ratio` (`imbalance_mean`): shown when the CI high < margin and,
  where the A/A imbalance interval is measured, below its low end too (an improvement the
  incumbent's own tie-breaks could make is not shown); else MARGINAL.
- GUARD `replay_fidelity`: over the windows where both fidelities are measured (not None,
  not NaN; an infinite one counts as out), a window is within tolerance when
  |fidelity_imbalance - 1| <= tol and |fidelity_step - 1| <= tol. It passes when at least
  `fidelity_window_share_min` (90%) of those windows are within tolerance AND the median
  of each fidelity over those windows is within tol of 1. No measured window, or a
  failure, is INCONCLUSIVE: a replay that does not reproduce the incumbent cannot judge
  the candidate.
- GUARD `predictor_calibration`: AUC >= min; not applicable when the candidate has no
  predictor (AUC None); below the minimum (or NaN) is MARGINAL.
- `noise_floor` (A/A): bootstrap CIs of aa / incumbent for throughput, TPOT P95 and
  imbalance (the last is shown here and bounds the OBJECTIVE). It is labelled wider than
  the margins when the A/A throughput CI low < the throughput margin or the A/A TPOT CI
  high > the TPOT margin (each checked only for a PRIMARY that decides, i.e. not dry
  run); that decides nothing by itself, the widened PRIMARY intervals do. No A/A at all
  is INCONCLUSIVE.
- `evidence`: windows >= `min_windows` and decisions >= `min_decisions`, else INCONCLUSIVE.

Verdict order: ERROR (no windows, a baseline or candidate never replayed, or unreadable
values) > FAIL > INCONCLUSIVE > MARGINAL > PASS. Within a verdict the deciding rule is
the first finding in row order (INCONCLUSIVE: evidence, latency, fidelity, noise floor,
then the PRIMARY intervals); the others are named after it. Dry-run metrics are
computed and printed but never decide.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from shadow.gate.evidence import WINDOW_METRIC_KEYS, Evidence
from shadow.gate.report import (
    EXIT_CODES,
    GateReport,
    MetricRow,
    fmt,
)
from shadow.gate.statistics import BootstrapResult, estimate_ratio
from shadow.gate.thresholds import GATE_METRICS, Thresholds

# Which finding decides among several of the same verdict (the rest are named after it).
_INCONCLUSIVE_ORDER = (
    "evidence",
    "decision_latency_p99_ms",
    "replay_fidelity",
    "noise_floor",
    "throughput_ratio",
    "tpot_p95_ratio",
)
_FIDELITY_EPS = 1e-9  # so a fidelity of exactly 1.10 is within a 10% tolerance


@dataclass(frozen=True)
class _Finding:
    metric: str
    effect: str  # FAIL, INCONCLUSIVE or MARGINAL
    sentence: str


class _Unreadable(Exception):
    pass


@dataclass
class _Arrays:
    inc: dict[str, np.ndarray]
    cand: dict[str, np.ndarray]
    aa: dict[str, np.ndarray]
    fid_imbalance: np.ndarray
    fid_step: np.ndarray
    #: arm -> per window its per-request TPOTs (None where not stored)
    tpot: dict[str, list[tuple[float, ...] | None]] = dataclasses.field(default_factory=dict)

    def arm(self, name: str) -> dict[str, np.ndarray]:
        return {"incumbent": self.inc, "candidate": self.cand, "aa": self.aa}[name]


def decide(evidence: Evidence, thresholds: Thresholds | None = None) -> GateReport:
    """Judge the evidence: rows per metric, then the verdict in GATE.md's order."""
    t = thresholds if thresholds is not None else Thresholds()
    evidence = after_warmup(evidence, t.warmup_windows)
    block = t.bootstrap_block_windows if any(
        getattr(w, "run_start", None) is not None for w in evidence.windows
    ) else 1  # fmt: skip
    try:
        arrays = _read(evidence)
    except _Unreadable as exc:
        return _report("ERROR", f"ERROR: evidence unreadable: {exc}.", (), {}, evidence, t)

    boot: dict[str, BootstrapResult] = {}
    rows: list[MetricRow] = []
    findings: list[_Finding] = []

    def add(row: MetricRow, finding: _Finding | None) -> None:
        if row.metric in t.dry_run:
            row = dataclasses.replace(
                row,
                label="dry run",
                rule=f"dry run (would be {row.label}): {row.rule}",
                dry_run=True,
            )
        elif finding is not None:
            findings.append(finding)
        rows.append(row)

    add(
        *_count_row(
            "critical_violations",
            evidence.critical_violations,
            t.critical_violations_max,
            evidence.decisions,
            "critical invariant violation",
            "critical invariant violations",
        )
    )
    add(
        *_count_row(
            "candidate_errors",
            evidence.candidate_errors,
            t.candidate_errors_max,
            evidence.decisions,
            "candidate decision error or timeout",
            "candidate decision errors or timeouts",
        )
    )
    add(*_latency_row(evidence, t))
    for floor, key in (
        ("noise_floor.throughput", "throughput_tok_s"),
        ("noise_floor.tpot_p95", "tpot_p95_ms"),
        ("noise_floor.imbalance", "imbalance_mean"),
    ):
        boot[floor] = _estimate(arrays, key, "aa", t, block)
    for metric, key, floor in (
        ("throughput_ratio", "throughput_tok_s", "noise_floor.throughput"),
        ("tpot_p95_ratio", "tpot_p95_ms", "noise_floor.tpot_p95"),
        ("imbalance_ratio", "imbalance_mean", "noise_floor.imbalance"),
    ):
        boot[metric] = _estimate(arrays, key, "candidate", t, block)
        add(*_ratio_row(metric, arrays.inc[key], arrays.cand[key], boot[metric], t, boot[floor]))
    add(*_fidelity_row(arrays, t))
    add(*_calibration_row(evidence.calibration_auc, t))
    add(*_noise_row(arrays, boot, t))
    add(*_evidence_row(evidence, t))

    error = _error_reason(evidence, arrays)
    if error is not None:
        return _report("ERROR", f"ERROR: {error}.", tuple(rows), boot, evidence, t)
    for verdict, order in (
        ("FAIL", GATE_METRICS),
        ("INCONCLUSIVE", _INCONCLUSIVE_ORDER),
        ("MARGINAL", GATE_METRICS),
    ):
        hits = sorted(
            (f for f in findings if f.effect == verdict), key=lambda f: order.index(f.metric)
        )
        if hits:
            sentence = f"{verdict}: {hits[0].sentence}"
            if len(hits) > 1:
                sentence += "; also " + ", ".join(f.metric for f in hits[1:])
            return _report(verdict, sentence + ".", tuple(rows), boot, evidence, t)
    return _report("PASS", _pass_sentence(rows, boot, t), tuple(rows), boot, evidence, t)


# --- rows -------------------------------------------------------------------------------


def _count_row(
    metric: str, count: int, allowed: int, decisions: int, noun: str, plural: str
) -> tuple[MetricRow, _Finding | None]:
    text = f"{count} {noun if count == 1 else plural} (allowed {allowed})"
    ok = count <= allowed
    row = MetricRow(
        metric,
        "HARD",
        decisions,
        None,
        float(count),
        None,
        None,
        None,
        f"<= {allowed}",
        "pass" if ok else "fail",
        text,
        False,
    )
    return row, None if ok else _Finding(metric, "FAIL", f"HARD rule {metric}: {text}")


def _latency_row(ev: Evidence, t: Thresholds) -> tuple[MetricRow, _Finding | None]:
    metric = "decision_latency_p99_ms"
    cap, frac = t.decision_latency_p99_ms_max, t.decision_latency_step_fraction_max
    step = ev.step_ms_mean
    step_known = step is not None and math.isfinite(step) and step > 0
    margin = f"<= {_m(cap)} ms and <= {_m(frac)} x step"
    p99 = ev.decision_latency_p99_ms

    def row(value: float | None, label: str, text: str) -> MetricRow:
        return MetricRow(
            metric, "HARD", ev.decisions, None, value, None, None, None, margin, label, text, False
        )

    if p99 is None or math.isnan(p99):
        text = "candidate decision latency P99 not measured"
        return row(None, "missing", text), _Finding(metric, "INCONCLUSIVE", text)
    broken = []
    if p99 > cap:
        broken.append(f"exceeds {_m(cap)} ms")
    if step_known:
        limit = frac * step  # type: ignore[operator]
        step_text = f"{_m(frac)} x {step:.2f} ms step = {limit:.3f} ms"
        if p99 > limit:
            broken.append(f"exceeds {step_text}")
    else:
        step_text = "step time unknown, only the cap applies"
    if broken:
        text = f"decision latency P99 {p99:.3f} ms {' and '.join(broken)}"
        return row(p99, "fail", text), _Finding(metric, "FAIL", f"HARD rule {metric}: {text}")
    return row(p99, "pass", f"P99 {p99:.3f} ms <= {_m(cap)} ms ({step_text})"), None


_RATIO_NAMES = {
    "throughput_ratio": "throughput ratio",
    "tpot_p95_ratio": "TPOT P95 ratio",
    "imbalance_ratio": "imbalance ratio",
}


def _ratio_row(
    metric: str,
    inc: np.ndarray,
    cand: np.ndarray,
    b: BootstrapResult,
    t: Thresholds,
    aa: BootstrapResult | None = None,
) -> tuple[MetricRow, _Finding | None]:
    name = _RATIO_NAMES[metric]
    keep = np.isfinite(inc) & np.isfinite(cand)
    inc_mean = float(inc[keep].mean()) if keep.any() else None
    cand_mean = float(cand[keep].mean()) if keep.any() else None
    shown = f"{name} {fmt(b.point)} [{fmt(b.ci_low)}, {fmt(b.ci_high)}]"
    measured = not (math.isnan(b.ci_low) or math.isnan(b.ci_high))
    finding: _Finding | None = None
    if metric in ("throughput_ratio", "tpot_p95_ratio"):
        # A difference the incumbent makes against itself is not the candidate's: the
        # interval is judged widened on both sides by how far the A/A moved from 1.
        noise = _aa_deviation(aa)
        low, high = b.ci_low - noise, b.ci_high + noise
        if noise > 0 and measured:
            shown += f" widened by the A/A deviation {noise:.4f} to [{fmt(low)}, {fmt(high)}]"
        higher_is_better = metric == "throughput_ratio"
        if higher_is_better:
            m = t.throughput_ratio_ci_low_min
            margin = f"CI low >= {_m(m)}"
            passes, fails = low >= m, high < m
            pass_text, fail_text = f">= {_m(m)}", f"is entirely below {_m(m)}"
        else:
            m = t.tpot_p95_ratio_ci_high_max
            margin = f"CI high <= {_m(m)}"
            passes, fails = high <= m, low > m
            pass_text, fail_text = f"<= {_m(m)}", f"is entirely above {_m(m)}"
        if not measured:
            label, text = "missing", f"{name} not measured (no window with both values)"
            finding = _Finding(metric, "INCONCLUSIVE", f"PRIMARY {metric}: {text}")
        elif passes:
            label, text = "pass", f"{shown} {pass_text}"
        elif fails:
            label, text = "fail", f"{shown} {fail_text}"
            finding = _Finding(metric, "FAIL", f"PRIMARY rule {metric}: {text}")
        else:
            label, text = "straddles", f"{shown} straddles {_m(m)}"
            finding = _Finding(metric, "INCONCLUSIVE", f"PRIMARY {metric}: {text}")
        role = "PRIMARY"
    else:
        m = t.imbalance_ratio_ci_high_max
        margin = f"CI high < {_m(m)}"
        floor = aa.ci_low if aa is not None else math.nan
        if not measured:
            label, text = "not shown", f"{name} not measured (no window with both values)"
        elif b.ci_high >= m:
            label, text = "not shown", f"{shown} is not entirely below {_m(m)}"
        elif not math.isnan(floor) and b.ci_high >= floor:
            label = "not shown"
            text = f"{shown} reaches the A/A noise floor (A/A low {fmt(floor)})"
        else:
            label, text = "shown", f"{shown} < {_m(m)}"
        if label != "shown":
            finding = _Finding(metric, "MARGINAL", f"OBJECTIVE {metric} not shown: {text}")
        role = "OBJECTIVE"
    row = MetricRow(
        metric,
        role,
        b.n,
        inc_mean,
        cand_mean,
        _opt(b.point),
        _opt(b.ci_low),
        _opt(b.ci_high),
        margin,
        label,
        text,
        False,
    )
    return row, finding


def _fidelity_row(a: _Arrays, t: Thresholds) -> tuple[MetricRow, _Finding | None]:
    metric, tol, share_min = "replay_fidelity", t.fidelity_tolerance, t.fidelity_window_share_min
    margin = f">= {share_min:.0%} of windows and both medians within {tol:.0%} of observed"
    measured = ~np.isnan(a.fid_imbalance) & ~np.isnan(a.fid_step)
    n = int(measured.sum())
    if n == 0:
        text = "replay fidelity not measured in any window"
        row = MetricRow(
            metric, "GUARD", 0, None, None, None, None, None, margin, "missing", text, False
        )
        return row, _Finding(metric, "INCONCLUSIVE", f"GUARD {text}")
    fi, fs = a.fid_imbalance[measured], a.fid_step[measured]
    bound = tol + _FIDELITY_EPS
    within = (np.abs(fi - 1.0) <= bound) & (np.abs(fs - 1.0) <= bound)
    share = float(within.mean())
    med_i, med_s = float(np.median(fi)), float(np.median(fs))
    ok = share >= share_min and abs(med_i - 1.0) <= bound and abs(med_s - 1.0) <= bound
    text = (
        f"{share:.0%} of {n} windows within {tol:.0%} of observed (need >= {share_min:.0%}), "
        f"median imbalance fidelity {med_i:.3f}, step {med_s:.3f}"
    )
    row = MetricRow(
        metric,
        "GUARD",
        n,
        None,
        None,
        share,
        None,
        None,
        margin,
        "pass" if ok else "failed",
        text,
        False,
    )
    return row, None if ok else _Finding(metric, "INCONCLUSIVE", f"GUARD {metric} failed: {text}")


def _calibration_row(auc: float | None, t: Thresholds) -> tuple[MetricRow, _Finding | None]:
    metric, m = "predictor_calibration", t.calibration_auc_min
    margin = f"AUC >= {_m(m)}"
    if auc is None:
        row = MetricRow(
            metric,
            "GUARD",
            0,
            None,
            None,
            None,
            None,
            None,
            margin,
            "n/a",
            "not applicable: the candidate has no predictor",
            False,
        )
        return row, None
    if math.isnan(auc):
        label, text = "missing", "predictor AUC not measured"
    elif auc >= m:
        label, text = "pass", f"AUC {auc:.3f} >= {_m(m)}"
    else:
        label, text = "out of bounds", f"AUC {auc:.3f} < {_m(m)}"
    row = MetricRow(
        metric, "GUARD", 0, None, _opt(auc), None, None, None, margin, label, text, False
    )
    if label == "pass":
        return row, None
    return row, _Finding(metric, "MARGINAL", f"GUARD {metric} out of bounds: {text}")


def _noise_row(
    a: _Arrays, boot: dict[str, BootstrapResult], t: Thresholds
) -> tuple[MetricRow, _Finding | None]:
    metric = "noise_floor"
    thr, tpot = boot["noise_floor.throughput"], boot["noise_floor.tpot_p95"]
    imbalance = boot["noise_floor.imbalance"]
    m_thr, m_tpot = t.throughput_ratio_ci_low_min, t.tpot_p95_ratio_ci_high_max
    margin = f"A/A throughput CI low >= {_m(m_thr)}, A/A TPOT P95 CI high <= {_m(m_tpot)}"
    n = int(np.sum(np.isfinite(a.aa["throughput_tok_s"]) | np.isfinite(a.aa["tpot_p95_ms"])))
    checks = [
        (
            "throughput_ratio",
            "A/A throughput ratio",
            thr,
            lambda b: b.ci_low < m_thr,
            f"reaches below {_m(m_thr)}",
        ),
        (
            "tpot_p95_ratio",
            "A/A TPOT P95 ratio",
            tpot,
            lambda b: b.ci_high > m_tpot,
            f"reaches above {_m(m_tpot)}",
        ),
    ]
    shown = [
        f"{name} {fmt(b.point)} [{fmt(b.ci_low)}, {fmt(b.ci_high)}]" for _, name, b, _, _ in checks
    ]
    shown.append(
        f"A/A imbalance ratio {fmt(imbalance.point)} "
        f"[{fmt(imbalance.ci_low)}, {fmt(imbalance.ci_high)}]"
    )
    deciding = [c for c in checks if c[0] not in t.dry_run]
    missing = [c[1] for c in deciding if math.isnan(c[2].ci_low) or math.isnan(c[2].ci_high)]
    wider = [
        f"{name} [{fmt(b.ci_low)}, {fmt(b.ci_high)}] {why}"
        for primary, name, b, too_wide, why in deciding
        if name not in missing and too_wide(b)
    ]
    finding: _Finding | None = None
    if not deciding:
        label, text = "n/a", "no deciding PRIMARY metric; " + ", ".join(shown)
    elif missing:
        label, text = "missing", f"noise floor not measured ({', '.join(missing)}: no A/A replay)"
        finding = _Finding(metric, "INCONCLUSIVE", text)
    elif wider:
        # Not INCONCLUSIVE by itself: each PRIMARY interval is judged widened by this
        # floor, so an effect larger than the noise is still called and one inside it
        # straddles its margin.
        label, text = (
            "wider than margins",
            "noise floor wider than the margins: "
            + " and ".join(wider)
            + " (each PRIMARY interval is judged widened by it)",
        )
    else:
        label, text = "within margins", ", ".join(shown) + ": within the margins"
    if n and _aa_is_the_incumbent(a):
        # A rule with no ties left to draw replays the same on relabelled workers: the
        # floor is then the windows' bootstrap alone, and the reader should know it.
        text += (
            " (the A/A replay equals the incumbent in every window: a deterministic rule "
            "without ties, so the floor is the bootstrap over windows alone)"
        )
    row = MetricRow(metric, "NOISE", n, None, None, None, None, None, margin, label, text, False)
    return row, finding


def _aa_deviation(aa: BootstrapResult | None) -> float:
    """How far the incumbent moved against itself, |A/A ratio - 1| (0 when not measured).
    The point, not the interval's reach: the interval's width is the windows' resampling
    noise, which the candidate's own interval already carries (widening by it as well
    counted that noise twice, and a candidate equal to the incumbent below saturation,
    1.001 [0.995, 1.006], straddled 0.99)."""
    if aa is None or not math.isfinite(aa.point):
        return 0.0
    return abs(aa.point - 1.0)


def _aa_is_the_incumbent(a: _Arrays) -> bool:
    """Whether the A/A run reproduced the incumbent exactly wherever both were measured."""
    for key in ("throughput_tok_s", "tpot_p95_ms", "imbalance_mean"):
        both = np.isfinite(a.inc[key]) & np.isfinite(a.aa[key])
        if not both.any() or not np.array_equal(a.inc[key][both], a.aa[key][both]):
            return False
    return True


def _evidence_row(ev: Evidence, t: Thresholds) -> tuple[MetricRow, _Finding | None]:
    windows, decisions = len(ev.windows), ev.decisions
    parts = [
        f"{windows} windows (need >= {t.min_windows})",
        f"{decisions} decisions (need >= {t.min_decisions})",
    ]
    short = [
        p
        for p, ok in zip(
            parts, (windows >= t.min_windows, decisions >= t.min_decisions), strict=True
        )
        if not ok
    ]
    margin = f">= {t.min_windows} windows, >= {t.min_decisions} decisions"
    row = MetricRow(
        "evidence",
        "EVIDENCE",
        windows,
        None,
        None,
        None,
        None,
        None,
        margin,
        "too little" if short else "pass",
        ", ".join(parts),
        False,
    )
    if short:
        return row, _Finding("evidence", "INCONCLUSIVE", "too little evidence: " + ", ".join(short))
    return row, None


def _pass_sentence(rows: list[MetricRow], boot: dict[str, BootstrapResult], t: Thresholds) -> str:
    parts = []
    for metric, op, m in (
        ("throughput_ratio", ">=", t.throughput_ratio_ci_low_min),
        ("tpot_p95_ratio", "<=", t.tpot_p95_ratio_ci_high_max),
        ("imbalance_ratio", "<", t.imbalance_ratio_ci_high_max),
    ):
        b = boot[metric]
        text = f"{_RATIO_NAMES[metric]} {fmt(b.point)} [{fmt(b.ci_low)}, {fmt(b.ci_high)}]"
        dry = metric in t.dry_run
        parts.append(f"{text} (dry run, not deciding)" if dry else f"{text} {op} {_m(m)}")
    others = [
        r.metric
        for r in rows
        if r.dry_run and r.metric not in ("throughput_ratio", "tpot_p95_ratio", "imbalance_ratio")
    ]
    tail = f" (dry run, not deciding: {', '.join(others)})" if others else ""
    return f"PASS: {', '.join(parts)}, all guards in bounds{tail}."


# --- evidence reading -------------------------------------------------------------------


def _read(ev: Evidence) -> _Arrays:
    for name in ("decisions", "critical_violations", "candidate_errors"):
        value = getattr(ev, name)
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise _Unreadable(f"{name} must be a count, got {value!r}")
    for name in ("decision_latency_p99_ms", "step_ms_mean", "calibration_auc"):
        _num(getattr(ev, name), name)
    n = len(ev.windows)
    inc = {k: np.full(n, np.nan) for k in WINDOW_METRIC_KEYS}
    cand = {k: np.full(n, np.nan) for k in WINDOW_METRIC_KEYS}
    aa = {k: np.full(n, np.nan) for k in WINDOW_METRIC_KEYS}
    fid_i, fid_s = np.full(n, np.nan), np.full(n, np.nan)
    tpot: dict[str, list[tuple[float, ...] | None]] = {"incumbent": [], "candidate": [], "aa": []}
    for i, w in enumerate(ev.windows):
        for arm, values in tpot.items():
            values.append(getattr(w, f"{arm}_tpot", None))
        where = f"window {getattr(w, 'window_index', i)}"
        for arm, target in (("incumbent", inc), ("candidate", cand), ("aa", aa)):
            values = getattr(w, arm)
            if values is None:
                continue
            if not isinstance(values, dict):
                raise _Unreadable(f"{where} {arm} metrics are not a mapping")
            for key in WINDOW_METRIC_KEYS:
                target[key][i] = _num(values.get(key), f"{where} {arm} {key}")
        fid_i[i] = _num(w.fidelity_imbalance, f"{where} fidelity_imbalance")
        fid_s[i] = _num(w.fidelity_step, f"{where} fidelity_step")
    return _Arrays(inc, cand, aa, fid_i, fid_s, tpot)


def _num(value: Any, where: str) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _Unreadable(f"{where} is not a number ({value!r})")
    return float(value)


def _error_reason(ev: Evidence, a: _Arrays) -> str | None:
    if not ev.windows:
        return "no windows in the evidence (nothing was replayed)"
    for arm, values, who in (
        ("incumbent", a.inc, ev.baseline),
        ("candidate", a.cand, ev.candidate),
    ):
        if not any(np.isfinite(v).any() for v in values.values()):
            return f"{arm} {who} was never replayed (no window has its metrics)"
    return None


# --- formatting -------------------------------------------------------------------------


def _report(
    verdict: str,
    sentence: str,
    rows: tuple[MetricRow, ...],
    boot: dict[str, BootstrapResult],
    ev: Evidence,
    t: Thresholds,
) -> GateReport:
    return GateReport(verdict, EXIT_CODES[verdict], sentence, rows, boot, ev, t)


def _estimate(a: _Arrays, key: str, arm: str, t: Thresholds, block: int) -> BootstrapResult:
    """The `arm` / incumbent ratio of `key` as the truth measures it (`estimate_ratio`)."""
    return estimate_ratio(
        key, a.inc, a.arm(arm), a.tpot.get("incumbent", []), a.tpot.get(arm, []),
        resamples=t.bootstrap_resamples, confidence=t.confidence, seed=t.seed, block=block,
    )  # fmt: skip


def past_warmup(
    window_index: int, run_start: int | None, run_start_held: int | None, warmup: int
) -> bool:
    """Whether a window is evidence: not among the first `warmup` windows after a start
    of the continuous runs from a fleet that held requests (it still holds what the
    incumbent placed). Windows replayed on their own (no `run_start`), and those of runs
    started from an empty fleet (nothing placed, so nothing to wash out: a full replay
    measures that ramp-up too), all are."""
    return run_start is None or run_start_held == 0 or window_index - run_start >= warmup


def after_warmup(evidence: Evidence, warmup: int) -> Evidence:
    """The evidence without its warm-up windows (`past_warmup`)."""
    kept = tuple(
        w
        for w in evidence.windows
        if past_warmup(
            w.window_index,
            getattr(w, "run_start", None),
            getattr(w, "run_start_held", None),
            warmup,
        )
    )
    if len(kept) == len(evidence.windows):
        return evidence
    return dataclasses.replace(evidence, windows=kept)


def _m(x: float) -> str:
    """A margin as written in GATE.md: 0.99, 1.05, 1.0, 5.0."""
    return f"{x:.1f}" if float(x).is_integer() else f"{x:g}"


def _opt(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else float(x)
