"""One sweep cell: one policy's replay of one trace under one set of parameters.

Plain data in (a workload and a parameter mapping), plain data out (the metrics, and the
per-step series when asked), so the same function runs in this process, in a process pool
or as a Ray task and gives the same numbers; only `sched_ms_*` (wall time) differ. The
replay itself is `shadow.analysis.replay_run`'s, the same path `shadow replay` takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadow.analysis.replay_run import replay_policy, retimed
from shadow.policies import BalanceRouteConfig, is_balance_route
from shadow.replay.workload import StepModel, Workload

#: Metrics that measure wall time, not the simulated fleet: they differ between runs.
TIMING_METRICS = ("sched_ms_p50", "sched_ms_p99")
_CONFIG_FIELDS = ("horizon", "alpha", "beta", "gamma", "s_greedy", "r_max")


def balance_config(params: Mapping[str, Any]) -> BalanceRouteConfig | None:
    """The BR configuration of a cell (None for baselines); unset fields keep defaults."""
    policy = str(params["policy"])
    if not is_balance_route(policy):
        return None
    given = {name: params[name] for name in _CONFIG_FIELDS if params.get(name) is not None}
    return BalanceRouteConfig(**given)


def run_cell(workload: Workload, params: Mapping[str, Any], steps: bool = False) -> dict[str, Any]:
    """Replay `workload` as the cell `params` says; `{"requests", "metrics"}` and, with
    `steps`, `{"steps", "worker_load", "worker_active"}` for the replay tables."""
    model = StepModel(float(params["step_a"]), float(params["step_b"]))
    workers, batch = int(params["workers"]), int(params["batch"])
    load = params.get("load")
    workload = retimed(
        workload,
        workers=workers,
        batch=batch,
        step_model=model,
        load=float(load) if load is not None else None,
    )
    run = replay_policy(
        workload,
        str(params["policy"]),
        workers=workers,
        batch=batch,
        step_model=model,
        seed=int(params["seed"]),
        config=balance_config(params),
    )
    out: dict[str, Any] = {"requests": len(workload), "metrics": run.metrics}
    if steps:
        out["steps"] = run.step_series()
        out["worker_load"] = run.result.worker_load
        out["worker_active"] = run.result.worker_active
    return out
