"""The metrics of BALANCEROUTE.md, computed vectorised from a replay's per-step series.

Exact definitions (steps with no active request are not steps and are never recorded):
imbalance `max_g L_g - min_g L_g`; gap `G * max_g L_g - sum_g L_g`; idle fraction
`sum_k sum_g (T_step - T_g) / (G * sum_k T_step)` with `T_g = a * L_g + b`; throughput
output tokens over wall time; TPOT per request `(t_last - t_first) / (o - 1)` over requests
with `o >= 2` whose first token fell inside the run; pool wait from ready to admitted
(for `vllm-dplb`, to leaving its rank's queue); scheduler time per admission round.
"""

from __future__ import annotations

import math

import numpy as np

from shadow.replay.records import ReplayResult

METRICS = (
    "imbalance_mean",
    "gap_mean",
    "idle_frac",
    "throughput_tok_s",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "tpot_p99_ms",
    "pool_wait_p95_ms",
    "sched_ms_p50",
    "sched_ms_p99",
    "steps",
    "makespan_s",
    "output_tokens",
)
"""Every metric of one replay, in the order of the replay JSON and the report."""
COUNT_METRICS = ("steps", "output_tokens")
"""The metrics that are counts (integers); every other one is a float."""


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def per_step(result: ReplayResult) -> dict[str, np.ndarray]:
    """Per-step imbalance, gap and max/min/sum load."""
    loads = result.worker_load
    if not loads.size:
        empty = np.empty(0, dtype=np.int64)
        return {"max": empty, "min": empty, "sum": empty, "imbalance": empty, "gap": empty}
    top = loads.max(axis=1)
    bottom = loads.min(axis=1)
    total = loads.sum(axis=1)
    return {
        "max": top,
        "min": bottom,
        "sum": total,
        "imbalance": top - bottom,
        "gap": result.workers * top - total,
    }


def tpot_ms(result: ReplayResult) -> np.ndarray:
    """Per request with `o >= 2` whose decoding the run saw from its first token."""
    ends = result.step_end_ms
    eligible = (result.output_tokens >= 2) & (result.admit_step >= 0) & ~result.from_initial
    first = ends[result.admit_step[eligible]]
    last = ends[result.finish_step[eligible]]
    return (last - first) / (result.output_tokens[eligible] - 1)


def output_tokens_generated(result: ReplayResult) -> int:
    """Tokens generated during the run (initial requests count only what is left)."""
    started = result.admit_step >= 0
    from_run = result.output_tokens[started & ~result.from_initial].sum()
    from_initial = (result.finish_step[result.from_initial] + 1).sum()
    return int(from_run + from_initial)


def summarize(result: ReplayResult) -> dict[str, float]:
    """Every metric of one replay, keyed as in the replay JSON."""
    series = per_step(result)
    model = result.step_model
    durations = result.step_duration_ms
    busy_ms = float(durations.sum())
    makespan_ms = float(result.step_end_ms[-1]) if durations.size else 0.0
    tokens = output_tokens_generated(result)
    tpot = tpot_ms(result)
    waited = ~result.from_initial & (result.admit_step >= 0)
    pool_wait = result.admit_ms[waited] - result.ready_ms[waited]
    idle = (
        model.a_ms_per_token * float(series["gap"].sum()) / (result.workers * busy_ms)
        if busy_ms
        else math.nan
    )
    return {
        "imbalance_mean": _mean(series["imbalance"]),
        "gap_mean": _mean(series["gap"]),
        "idle_frac": idle,
        "throughput_tok_s": tokens / (makespan_ms / 1000.0) if makespan_ms else math.nan,
        "tpot_p50_ms": _percentile(tpot, 50),
        "tpot_p95_ms": _percentile(tpot, 95),
        "tpot_p99_ms": _percentile(tpot, 99),
        "pool_wait_p95_ms": _percentile(pool_wait, 95),
        "sched_ms_p50": _percentile(result.sched_ms, 50),
        "sched_ms_p99": _percentile(result.sched_ms, 99),
        "steps": result.steps,
        "makespan_s": makespan_ms / 1000.0,
        "output_tokens": tokens,
    }
