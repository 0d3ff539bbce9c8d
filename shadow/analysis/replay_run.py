"""One replay run from workload to stored numbers: the path `shadow replay` and every sweep
cell take, so that a sweep cell is the same replay as `shadow replay` by construction.

Re-time the workload, replay it under a policy and summarise the result; store the runs
of several policies as one replay run. Pure core: the workload arrives resolved (by
`shadow.workloads`) and the writer from the caller (the CLI passes its `Database`).

It stands above the simulator (`shadow.replay`) and the workload sources, beside the
metrics it summarises with: the simulator imports neither (tests/test_architecture.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shadow.analysis.metrics import per_step, summarize
from shadow.policies import BalanceRouteConfig, make_policy
from shadow.replay.engine import replay
from shadow.replay.records import ProgressCallback, ReplayResult
from shadow.replay.workload import StepModel, Workload
from shadow.workloads.traces import retime


class EmptyWorkload(ValueError):
    """Filtering left nothing to replay."""


def require_requests(workload: Workload, trace: str) -> Workload:
    """`workload`, or `EmptyWorkload` when it has no request (a replay of nothing is an
    error the user should see, not a table of NaNs)."""
    if not len(workload):
        raise EmptyWorkload(f"{trace}: no requests left to replay after filtering")
    return workload


def retimed(
    workload: Workload,
    *,
    workers: int,
    batch: int,
    step_model: StepModel,
    load: float | None = None,
    rate_scale: float | None = None,
) -> Workload:
    """The arrivals the replay sees: re-timed to `load` or by `rate_scale`, else as given."""
    if load is None and rate_scale is None:
        return workload
    return retime(
        workload,
        rate_scale=rate_scale,
        load=load,
        workers=workers,
        batch=batch,
        step_model=step_model,
    )


@dataclass(frozen=True)
class PolicyRun:
    """One policy's replay and its summary metrics (`shadow.analysis.metrics.METRICS`)."""

    policy: str
    result: ReplayResult
    metrics: dict[str, float]

    def step_series(self) -> dict[str, np.ndarray]:
        """The per-step series stored in `replay_steps` (one entry per step)."""
        series = per_step(self.result)
        return {
            "start_ms": self.result.step_start_ms,
            "duration_ms": self.result.step_duration_ms,
            "max_load": series["max"],
            "min_load": series["min"],
            "sum_load": series["sum"],
            "active": self.result.worker_active.sum(axis=1),
        }


def replay_policy(
    workload: Workload,
    policy: str,
    *,
    workers: int,
    batch: int,
    step_model: StepModel,
    seed: int = 0,
    config: BalanceRouteConfig | None = None,
    progress: ProgressCallback | None = None,
    decide_on_arrival: bool = False,
) -> PolicyRun:
    """Replay `workload` under the policy named `policy` (built fresh with `seed` and, for
    BR, `config`) and summarise it (`decide_on_arrival`: as `replay.engine.replay`)."""
    result = replay(
        workload,
        make_policy(policy, seed=seed, config=config),
        workers=workers,
        batch=batch,
        step_model=step_model,
        progress=progress,
        decide_on_arrival=decide_on_arrival,
    )
    return PolicyRun(policy, result, summarize(result))


class ReplayWriter(Protocol):
    """Where a replay run is stored (`shadow.storage.Database`): the run row, the summary
    per policy, and per policy the step series and the [steps, workers] arrays."""

    def save_replay(
        self,
        run: Mapping[str, Any],
        summaries: Mapping[str, Mapping[str, float]],
        steps: Mapping[str, Mapping[str, np.ndarray]],
        worker_loads: Mapping[str, np.ndarray] | None = None,
        worker_active: Mapping[str, np.ndarray] | None = None,
    ) -> int: ...


def store_runs(writer: ReplayWriter, run: Mapping[str, Any], runs: Mapping[str, PolicyRun]) -> int:
    """Store `runs` with their step series and worker arrays as one run (`run` holds the
    `replay_runs` columns); its run id."""
    return writer.save_replay(
        run,
        {name: r.metrics for name, r in runs.items()},
        {name: r.step_series() for name, r in runs.items()},
        {name: r.result.worker_load for name, r in runs.items()},
        {name: r.result.worker_active for name, r in runs.items()},
    )
