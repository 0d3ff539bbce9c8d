"""The gate's estimates against the truth they estimate (`shadow bench bias`).

Recorded traffic where the truth is known: the incumbent's replay of `paper-azure2024`
(G = 8, B = 64) at a load, emitted as events and ingested through the service's own
pipeline; the gate then estimates each candidate's throughput, TPOT P95 and imbalance
ratios. The truth is the same arrivals replayed end to end under each policy with the
same step model (`shadow replay`): its ratio against the incumbent's replay. A cell is
within tolerance when the estimate is within 10% of the true effect (ratio - 1), or
within 0.003 of the ratio where the effect is under 0.03 (issue 22), and covered when the
95% interval holds the truth.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from shadow.analysis.metrics import summarize
from shadow.events import iter_file
from shadow.gate.command import GateRequest, run_gate
from shadow.gate.source import open_evidence
from shadow.gate.thresholds import Thresholds
from shadow.policies import make_policy
from shadow.replay import ReplayResult, replay
from shadow.replay.events import write_events
from shadow.replay.workload import StepModel, Workload
from shadow.service.runtime import Runtime
from shadow.service.settings import load_settings
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime

CANDIDATES = ("brh-survival", "br0", "random", "rr")
LOADS = (0.8, 1.0, 1.1)
#: gate row -> the replay summary's metric it estimates
METRICS = {
    "throughput_ratio": "throughput_tok_s",
    "tpot_p95_ratio": "tpot_p95_ms",
    "imbalance_ratio": "imbalance_mean",
}


def interval_covers(low: float | None, high: float | None, truth: float) -> bool:
    """Whether a 95% interval (None where not measured) holds the truth."""
    return low is not None and high is not None and low <= truth <= high


def within_tolerance(estimate: float | None, truth: float) -> bool:
    """Issue 22's tolerance: within 10% of the true effect (ratio - 1), or within 0.003
    of the ratio where the effect is under 0.03."""
    if estimate is None:
        return False
    effect = truth - 1.0
    allowed = 0.1 * abs(effect) if abs(effect) >= 0.03 else 0.003
    return abs(estimate - truth) <= allowed


@dataclass(frozen=True)
class Cell:
    incumbent: str
    load: float
    candidate: str
    metric: str
    truth: float
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str
    deciding: str

    @property
    def within(self) -> bool:
        return within_tolerance(self.estimate, self.truth)

    @property
    def covered(self) -> bool:
        return interval_covers(self.ci_low, self.ci_high, self.truth)


def record(
    log: Path,
    incumbent: str,
    load: float,
    requests: int,
    model: StepModel,
    workers: int = 8,
    batch: int = 64,
) -> tuple[Workload, ReplayResult]:
    """Recorded traffic where the truth is known: `paper-azure2024` retimed to `load`,
    replayed under the incumbent and written to `log` as the events a live fleet sends."""
    workload = retime(
        generate("paper-azure2024", seed=0, n=requests),
        load=load,
        workers=workers,
        batch=batch,
        step_model=model,
    )
    observed = replay(
        workload, make_policy(incumbent), workers=workers, batch=batch, step_model=model
    )
    write_events(log, observed, workload.prompt_keys)
    return workload, observed


def ingest_recorded(log: Path, db: Path, config: Path) -> None:
    """A recorded event log through the service's own pipeline, as a live feed would be."""
    runtime = Runtime(load_settings(config, db=db))
    try:
        for pairs, rejected in iter_file(log, batch_size=10_000):
            runtime.pipeline.submit(pairs, rejected)
        runtime.pipeline.finish()
    finally:
        runtime.close()


def measure(
    root: Path,
    incumbent: str = "jsq-pool",
    load: float = 1.0,
    requests: int = 10_000,
    mode: str = "continuous",
    candidates: tuple[str, ...] = CANDIDATES,
) -> list[Cell]:
    """One load's cells: record, ingest, gate each candidate, replay each for the truth."""
    model = StepModel()
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{incumbent}-{load}.jsonl"
    db = root / f"{incumbent}-{load}-{mode}.duckdb"
    workload, observed = record(log, incumbent, load, requests, model)
    config = root / f"{incumbent}-{mode}.toml"
    config.write_text(
        f'[windows]\nmode = "{mode}"\nincumbent = "{incumbent}"\n'
        f"policies = {json.dumps([incumbent, *candidates])}\n"
        # every candidate audited: the gate's decision-latency rule needs its rounds
        f"[audit]\npolicies = {json.dumps([incumbent, *candidates])}\n"
    )
    db.unlink(missing_ok=True)
    ingest_recorded(log, db, config)
    base = summarize(observed)
    cells = []
    store = open_evidence(db)
    try:
        for candidate in candidates:
            truth = summarize(
                replay(workload, make_policy(candidate), workers=8, batch=64, step_model=model)
            )
            request = GateRequest("default", candidate, incumbent, None, None, Thresholds(), True)
            report = run_gate(store, request)
            rows = {row.metric: row for row in report.rows}
            for metric, key in METRICS.items():
                row = rows[metric]
                cells.append(
                    Cell(
                        incumbent, load, candidate, metric, truth[key] / base[key], row.ratio,
                        row.ci_low, row.ci_high, report.verdict, report.deciding_rule,
                    )
                )  # fmt: skip
    finally:
        store.close()
    return cells


def table(cells: list[Cell]) -> str:
    """Plain text, one cell per line and a count per metric (a CI log reads it)."""

    def fmt(value: float | None) -> str:
        return "-" if value is None or math.isnan(value) else f"{value:.4f}"

    lines = []
    for metric in METRICS:
        mine = [c for c in cells if c.metric == metric]
        if not mine:
            continue
        lines.append(f"{metric}:")
        for c in mine:
            lines.append(
                f"  {c.incumbent} load {c.load:<4} {c.candidate:<13} truth {fmt(c.truth)}  "
                f"estimate {fmt(c.estimate)} [{fmt(c.ci_low)}, {fmt(c.ci_high)}]  "
                f"{'within' if c.within else 'OFF'}  {'covered' if c.covered else 'MISSED'}"
            )
        within = sum(c.within for c in mine)
        covered = sum(c.covered for c in mine)
        lines.append(f"  within tolerance {within}/{len(mine)}, covered {covered}/{len(mine)}")
    verdicts = {(c.load, c.candidate): c.deciding for c in cells}
    lines.append("verdicts:")
    lines += [f"  load {load} {cand}: {sentence}" for (load, cand), sentence in verdicts.items()]
    return "\n".join(lines)
