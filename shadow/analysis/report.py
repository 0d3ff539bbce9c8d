"""The replay report: the `--json` document of `shadow replay` and the paper-style table.

Numbers are rounded to fixed decimals so that the same replay gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shadow.analysis.metrics import METRICS
from shadow.replay.workload import StepModel

SCHEMA_VERSION = 1
DECIMALS = 4


def _clean(value: float | int) -> float | int | None:
    if isinstance(value, int):
        return value
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return round(float(value), DECIMALS)


def replay_report(
    *,
    trace: str,
    workers: int,
    batch: int,
    requests: int,
    step_model: StepModel,
    summaries: Mapping[str, Mapping[str, float]],
) -> dict:
    """`{"schema": 1, "trace", "workers", "batch", "requests", "step_model", "policies"}`."""
    return {
        "schema": SCHEMA_VERSION,
        "trace": trace,
        "workers": workers,
        "batch": batch,
        "requests": requests,
        "step_model": {"a_ms_per_token": step_model.a_ms_per_token, "b_ms": step_model.b_ms},
        "policies": {
            name: {metric: _clean(metrics[metric]) for metric in METRICS}
            for name, metrics in summaries.items()
        },
    }


def ratio(candidate: float | None, baseline: float | None) -> float | None:
    """candidate / baseline, or None when either is missing or the baseline is 0."""
    if candidate is None or baseline is None or baseline == 0:
        return None
    return candidate / baseline


#: The paper's headline metrics, each followed by its ratio to the baseline.
HEADLINE_COLUMNS = (
    ("imbalance_mean", "imbalance", "{:,.0f}"),
    ("throughput_tok_s", "tok/s", "{:,.0f}"),
    ("tpot_p95_ms", "TPOT P95 ms", "{:.1f}"),
)
#: Everything else, without ratios.
DETAIL_COLUMNS = (
    ("gap_mean", "gap I(k)", "{:,.0f}"),
    ("idle_frac", "idle", "{:.1%}"),
    ("tpot_p50_ms", "TPOT P50", "{:.1f}"),
    ("tpot_p99_ms", "TPOT P99", "{:.1f}"),
    ("pool_wait_p95_ms", "wait P95 ms", "{:,.0f}"),
    ("sched_ms_p50", "sched P50", "{:.3f}"),
    ("sched_ms_p99", "sched P99", "{:.3f}"),
)


def headline_headings(baseline: str = "jsq") -> list[str]:
    headings = []
    for _, heading, _ in HEADLINE_COLUMNS:
        headings += [heading, f"vs {baseline}"]
    return headings


def headline_rows(
    policies: Mapping[str, Mapping[str, float | None]], baseline: str = "jsq"
) -> list[list[str]]:
    """Per policy: each headline metric and its ratio to `baseline` (`0.52x`)."""
    reference = policies.get(baseline, {})
    rows = []
    for name, metrics in policies.items():
        cells = [name]
        for metric, _, fmt in HEADLINE_COLUMNS:
            value = metrics.get(metric)
            r = ratio(value, reference.get(metric))
            cells += [
                "-" if value is None else fmt.format(value),
                "-" if r is None else f"{r:.2f}x",
            ]
        rows.append(cells)
    return rows


def detail_rows(policies: Mapping[str, Mapping[str, float | None]]) -> list[list[str]]:
    return [
        [name]
        + [
            "-" if metrics.get(m) is None else fmt.format(metrics[m])
            for m, _, fmt in DETAIL_COLUMNS
        ]
        for name, metrics in policies.items()
    ]
