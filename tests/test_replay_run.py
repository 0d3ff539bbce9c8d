"""`shadow.analysis.replay_run`: the one replay path of `shadow replay` and the sweep cells."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from shadow.analysis.replay_run import (
    EmptyWorkload,
    replay_policy,
    require_requests,
    retimed,
    store_runs,
)
from shadow.policies import POLICY_NAMES
from shadow.replay.workload import StepModel
from shadow.sweep.cell import TIMING_METRICS, run_cell
from shadow.workloads.synthetic import generate

MODEL = StepModel()


def test_a_sweep_cell_is_the_replay_of_shadow_replay() -> None:
    workload = generate("small", seed=0)
    params = {"policy": "br0", "workers": 4, "batch": 16, "load": 0.9, "seed": 0,
              "step_a": MODEL.a_ms_per_token, "step_b": MODEL.b_ms}  # fmt: skip
    cell = run_cell(workload, params, steps=True)
    run = replay_policy(
        retimed(workload, workers=4, batch=16, step_model=MODEL, load=0.9),
        "br0",
        workers=4,
        batch=16,
        step_model=MODEL,
        seed=0,
    )
    untimed = {k: v for k, v in run.metrics.items() if k not in TIMING_METRICS}
    assert {k: v for k, v in cell["metrics"].items() if k not in TIMING_METRICS} == untimed
    for name, series in run.step_series().items():
        np.testing.assert_array_equal(cell["steps"][name], series)
    np.testing.assert_array_equal(cell["worker_load"], run.result.worker_load)


def test_retimed_without_load_or_rate_scale_is_the_workload_itself() -> None:
    workload = generate("small", seed=0)
    assert retimed(workload, workers=4, batch=16, step_model=MODEL) is workload


def test_an_empty_workload_is_an_error_that_names_the_trace() -> None:
    empty = generate("small", seed=0).head(0)
    with pytest.raises(EmptyWorkload, match=r"t\.csv: no requests left"):
        require_requests(empty, "t.csv")


def test_store_runs_hands_every_policy_to_the_writer() -> None:
    workload = generate("small", seed=0)
    runs = {
        name: replay_policy(workload, name, workers=4, batch=16, step_model=MODEL)
        for name in ("jsq", "br0")
    }
    calls = []

    class Writer:
        def save_replay(self, run, summaries, steps, worker_loads=None, worker_active=None):
            calls.append((run, summaries, steps, worker_loads, worker_active))
            return 7

    assert store_runs(Writer(), {"trace": "t"}, runs) == 7
    (run, summaries, steps, loads, active), = calls  # fmt: skip
    assert run == {"trace": "t"}
    assert list(summaries) == list(steps) == list(loads) == list(active) == ["jsq", "br0"]
    assert summaries["br0"] is runs["br0"].metrics


def test_the_replay_path_imports_no_edge_package() -> None:
    """The replay path is pure core: storing arrives as a writer, never an import."""
    code = (
        "import json, sys, shadow.analysis.replay_run; "
        "print(json.dumps([m.split('.')[1] for m in sys.modules if m.startswith('shadow.')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not loaded & {"storage", "cli", "service", "world", "connectors", "ui", "bench"}


def test_the_cli_policy_default_is_the_registry() -> None:
    from shadow.cli.shared import ALL_POLICIES

    assert ALL_POLICIES.split(",") == list(POLICY_NAMES)
