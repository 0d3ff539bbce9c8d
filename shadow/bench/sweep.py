"""Sweep throughput: cells per minute on a process pool of 1 and 2 workers and on a local
Ray runtime, and what Ray costs over the pool.

The same cells run on every executor without a database (storing a cell takes a few
milliseconds and does not depend on the executor); their results must agree, wall-time
metrics aside. Wall time counts from creating the executor to the last result: process
start-up (and `ray.init`) included, as a sweep pays it.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from typing import Any

from shadow.sweep.executors import CellTask, Executor, PoolExecutor, RayExecutor
from shadow.sweep.grid import SweepSpec, build_spec
from shadow.sweep.run import plan_sweep, results_by_key

DEFAULT_TRACE = "synthetic:paper-azure2024"
#: 45 BR-H cells of ~0.7 s each on 3,000 requests: about 2 minutes for all three executors.
DEFAULT_GRID = {"policy": "brh-survival", "beta": [20, 43, 80], "gamma": [0.8, 0.86, 0.95],
                "seed": [0, 1, 2, 3, 4]}  # fmt: skip
DEFAULT_FIXED = {"workers": 8, "batch": 64, "load": 1.0, "limit": 3000}
DEFAULT_EXECUTORS = (("pool", 1), ("pool", 2), ("ray", 2))


def default_spec(limit: int | None = None, seeds: int | None = None) -> SweepSpec:
    grid = dict(DEFAULT_GRID)
    if seeds is not None:
        grid["seed"] = list(range(seeds))
    fixed = DEFAULT_FIXED | ({} if limit is None else {"limit": limit})
    return build_spec(grid, fixed)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _executor(kind: str, workers: int) -> Executor:
    return RayExecutor(None, workers) if kind == "ray" else PoolExecutor(workers)


def run(
    trace: str = DEFAULT_TRACE,
    spec: SweepSpec | None = None,
    executors: Sequence[tuple[str, int]] = DEFAULT_EXECUTORS,
    note: Any = None,
) -> dict[str, Any]:
    """Run the grid on each executor; per executor cells, wall and start-up seconds and
    cells/minute, whether all agree, and Ray's overhead over the pool of as many workers."""
    plan = plan_sweep(trace, spec or default_spec())
    tasks = [CellTask(c.key, c.workload, c.params) for c in plan.cells]
    results: list[dict[str, Any]] = []
    reference: dict[str, Any] | None = None
    identical = True
    for kind, workers in executors:
        if note is not None:
            note(f"{kind} with {workers} workers: {len(tasks)} cells")
        children = _children_cpu_s()
        started = time.perf_counter()
        executor = _executor(kind, workers)
        with executor:
            entered = time.perf_counter()
            outcomes = list(executor.run(tasks, plan.workloads))
        wall = time.perf_counter() - started
        # Pool processes are our children (reaped at shutdown); Ray's workers are not.
        cpu = _children_cpu_s() - children if kind == "pool" else None
        failed = [o for o in outcomes if o.result is None]
        if failed:
            raise RuntimeError(f"{kind}: cell {failed[0].task.key} failed: {failed[0].error}")
        got = results_by_key({o.task.key: o.result for o in outcomes})
        if reference is None:
            reference = got
        identical = identical and got == reference
        results.append(
            {
                "executor": kind,
                "workers": workers,
                "cells": len(tasks),
                "wall_s": wall,
                "startup_s": entered - started,
                "cells_per_min": 60.0 * len(tasks) / wall,
                "cpu_s": cpu,
                # Below 1.0 the workers waited for a core (other jobs) or for work.
                "cpu_share": None if cpu is None else cpu / (wall * workers),
            }
        )
    overhead = {}
    for ray_result in (r for r in results if r["executor"] == "ray"):
        pool = next(
            (
                r
                for r in results
                if r["executor"] == "pool" and r["workers"] == ray_result["workers"]
            ),
            None,
        )
        if pool is not None:
            overhead = {
                "workers": pool["workers"],
                "wall": ray_result["wall_s"] / pool["wall_s"] - 1.0,
                "wall_without_init": (ray_result["wall_s"] - ray_result["startup_s"])
                / pool["wall_s"]
                - 1.0,
                "init_s": ray_result["startup_s"],
            }
    requests = len(next(iter(plan.workloads.values())))
    return {
        "trace": trace,
        "requests": requests,
        "grid": plan.spec_json(),
        "cells": len(tasks),
        "results": results,
        "identical": identical,
        "ray_overhead": overhead,
    }
