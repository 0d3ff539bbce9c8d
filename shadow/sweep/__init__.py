"""Parameter sweeps (`shadow sweep`): the cartesian product of a grid x seeds, each cell
one replay, run on a process pool or Ray, stored as ordinary replay runs, resumable.

`grid` (what varies, cell keys) and `cell` (one replay) and `results` (sensitivity tables,
heatmaps) are pure; `executors` decides where cells run; `store` and `run` hold the I/O.
"""

from shadow.sweep.cell import TIMING_METRICS, run_cell
from shadow.sweep.executors import (
    CellOutcome,
    CellTask,
    PoolExecutor,
    RayExecutor,
    RayUnavailable,
    SerialExecutor,
)
from shadow.sweep.grid import PARAMS, GridError, SweepSpec, build_spec, expand, load_grid
from shadow.sweep.results import configurations, heatmap, summarize_sweep
from shadow.sweep.run import SweepPlan, SweepRun, plan_sweep, run_sweep

__all__ = [
    "PARAMS",
    "TIMING_METRICS",
    "CellOutcome",
    "CellTask",
    "GridError",
    "PoolExecutor",
    "RayExecutor",
    "RayUnavailable",
    "SerialExecutor",
    "SweepPlan",
    "SweepRun",
    "SweepSpec",
    "build_spec",
    "configurations",
    "expand",
    "heatmap",
    "load_grid",
    "plan_sweep",
    "run_cell",
    "run_sweep",
    "summarize_sweep",
]
