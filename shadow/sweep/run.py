"""A sweep from grid to stored cells: load the trace once per seed, key every cell, skip
the cells already stored, run the rest on an executor and store each as it finishes."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shadow.analysis.replay_run import require_requests
from shadow.replay.workload import Workload
from shadow.storage import Database
from shadow.sweep.executors import CellOutcome, CellTask, Executor
from shadow.sweep.grid import SweepSpec, cell_key, expand, spec_hash, workload_digest
from shadow.sweep.store import ensure_sweep, link, save_cell, stored_cells
from shadow.workloads.traces import SYNTHETIC_PREFIX, resolve_workload


@dataclass(frozen=True)
class PlannedCell:
    key: str
    workload: str  # the digest of its workload
    params: dict[str, Any]


@dataclass
class SweepPlan:
    """Everything a sweep needs before running: its cells, and the workloads they replay
    (by digest; a preset has one per seed, a trace file one for all seeds)."""

    name: str
    trace: str
    spec: SweepSpec
    trace_options: dict[str, Any]
    cells: list[PlannedCell]
    workloads: dict[str, Workload]
    sources: dict[str, str]
    grid_size: int

    def spec_json(self) -> dict[str, Any]:
        return {"trace": self.trace, **self.spec.as_json(), "options": self.trace_options}


def plan_sweep(
    trace: str,
    spec: SweepSpec,
    *,
    name: str | None = None,
    name_hint: str = "sweep",
    trace_format: str = "auto",
    skip_bad: bool = False,
) -> SweepPlan:
    """Load the workloads and key every cell. Raises `GridError` (bad grid) or the trace
    loader's errors (`TraceError`, `ValueError`; `EmptyWorkload` when filtering left nothing)."""
    cells = expand(spec)
    limit = spec.trace.get("limit")
    output_min = spec.trace.get("output_min")
    options = {"limit": limit, "output_min": output_min, "format": trace_format}
    per_seed = trace.startswith(SYNTHETIC_PREFIX)
    workloads: dict[str, Workload] = {}
    sources: dict[str, str] = {}
    by_seed: dict[int | None, str] = {}
    for seed in sorted({int(c["seed"]) for c in cells}) if per_seed else [None]:
        loaded = resolve_workload(
            trace,
            format=trace_format,
            seed=seed or 0,
            output_min=output_min,
            limit=limit,
            skip_bad=skip_bad,
        )
        require_requests(loaded.workload, trace)
        digest = workload_digest(loaded.workload)
        workloads[digest] = loaded.workload
        sources[digest] = loaded.source
        by_seed[seed] = digest
    planned = []
    for params in cells:
        digest = by_seed[int(params["seed"]) if per_seed else None]
        planned.append(PlannedCell(cell_key(digest, params), digest, params))
    sweep_name = name or f"{name_hint}-{spec_hash(trace, spec, options)}"
    return SweepPlan(sweep_name, trace, spec, options, planned, workloads, sources, spec.size())


@dataclass
class SweepRun:
    """What one invocation did."""

    planned: int
    stored_before: int
    ran: int = 0
    failed: list[CellOutcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def cells_per_minute(self) -> float:
        return 60.0 * self.ran / self.seconds if self.seconds else 0.0


def prepare(plan: SweepPlan, database: Database) -> tuple[list[PlannedCell], int]:
    """Record the sweep, link the cells stored already (by any sweep) to it, and return
    the cells still to run and how many were stored."""
    ensure_sweep(database, plan.name, plan.trace, plan.spec_json())
    stored = stored_cells(database, (c.key for c in plan.cells))
    link(database, plan.name, stored)
    return [c for c in plan.cells if c.key not in stored], len(stored)


def run_sweep(
    plan: SweepPlan,
    database: Database,
    executor: Executor,
    *,
    steps: bool = False,
    todo: Sequence[PlannedCell] | None = None,
    on_cell: Callable[[CellOutcome, int], None] | None = None,
) -> SweepRun:
    """Run the cells not yet stored (`todo`, from `prepare` unless given) on `executor`
    (entered by the caller) and store each as it finishes; `on_cell(outcome, done)`."""
    stored = 0
    if todo is None:
        todo, stored = prepare(plan, database)
    else:
        stored = len(plan.cells) - len(todo)
    report = SweepRun(planned=len(plan.cells), stored_before=stored)
    tasks = [CellTask(c.key, c.workload, c.params, steps) for c in todo]
    started = time.perf_counter()
    for done, outcome in enumerate(executor.run(tasks, plan.workloads), start=1):
        if outcome.result is None:
            report.failed.append(outcome)
        else:
            save_cell(
                database,
                sweep=plan.name,
                key=outcome.task.key,
                params=outcome.task.params,
                source=plan.sources[outcome.task.workload],
                trace_digest=outcome.task.workload,
                trace_options=plan.trace_options,
                result=outcome.result,
            )
            report.ran += 1
        if on_cell is not None:
            on_cell(outcome, done)
    report.seconds = time.perf_counter() - started
    return report


def results_by_key(outcomes: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """`{key: metrics}` without the wall-time metrics: what must match across executors."""
    from shadow.sweep.cell import TIMING_METRICS

    return {
        key: {m: v for m, v in result["metrics"].items() if m not in TIMING_METRICS}
        for key, result in outcomes.items()
    }
