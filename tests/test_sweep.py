"""`shadow sweep`: grids, cell keys, resume, executors (pool, Ray), export, summaries and
the heatmap API."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from shadow.cli import app
from shadow.replay.workload import Workload
from shadow.storage import open_database
from shadow.sweep import (
    GridError,
    SerialExecutor,
    build_spec,
    expand,
    heatmap,
    load_grid,
    plan_sweep,
    run_sweep,
    summarize_sweep,
)
from shadow.sweep.executors import CellTask
from shadow.sweep.grid import cell_key, workload_digest
from shadow.sweep.run import results_by_key
from shadow.sweep.store import EngineQuery, sweep_rows
from tests.service_helpers import served

runner = CliRunner()

GRID = """
[grid]
policy = ["brh-oracle", "jsq"]
beta = [20, 43]
gamma = [0.8, 0.9]
seeds = [0, 1]

[fixed]
G = 4
B = 8
load = 1.0
limit = 60
"""
# brh-oracle: 2 x 2 x 2 seeds = 8 cells; jsq ignores beta and gamma: 2 seeds = 2 cells.
GRID_CELLS = 10


def _grid(tmp_path: Path, text: str = GRID) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def _count(db: Path, sql: str) -> int:
    with open_database(db) as database:
        return int(EngineQuery(database.engine).query(sql)[0]["n"])


# -- grids --------------------------------------------------------------------------------


def test_grid_file_expands_to_the_product_with_ignored_parameters_merged(tmp_path):
    spec = load_grid(_grid(tmp_path))
    assert spec.axes == {
        "policy": ("brh-oracle", "jsq"),
        "beta": (20.0, 43.0),
        "gamma": (0.8, 0.9),
        "seed": (0, 1),
    }
    assert spec.fixed == {"workers": 4, "batch": 8, "load": 1.0}
    assert spec.trace == {"limit": 60}
    assert spec.size() == 16
    cells = expand(spec)
    assert len(cells) == GRID_CELLS
    jsq = [c for c in cells if c["policy"] == "jsq"]
    assert [c["seed"] for c in jsq] == [0, 1]
    assert all(c[k] is None for c in jsq for k in ("horizon", "beta", "gamma", "s_greedy"))
    oracle = [c for c in cells if c["policy"] == "brh-oracle"]
    assert {(c["beta"], c["gamma"], c["seed"]) for c in oracle} == {
        (b, g, s) for b in (20.0, 43.0) for g in (0.8, 0.9) for s in (0, 1)
    }
    assert all(c["horizon"] == 80 and c["workers"] == 4 for c in oracle)


def test_param_options_override_the_grid_and_h0_ignores_alpha_beta_gamma():
    spec = build_spec({"beta": [1, 2]}, None, ["beta=20,43,60", "H=0,80", "policy=brh-survival"])
    assert spec.axes == {"beta": (20.0, 43.0, 60.0), "horizon": (0, 80)}
    cells = expand(spec)
    # H = 0 forces alpha = 1, beta = G: the three beta cells at H = 0 are one cell.
    assert len(cells) == 1 + 3
    assert [c["beta"] for c in cells if c["horizon"] == 0] == [None]
    assert build_spec(overrides=["H=80.0"]).fixed == {"horizon": 80}
    assert build_spec(overrides=["seeds=0,1,2"]).seeds() == (0, 1, 2)


@pytest.mark.parametrize(
    ("grid", "fixed", "options", "message"),
    [
        ({"bet": [1]}, None, [], "unknown parameter 'bet'"),
        ({"gamma": [0.5, 1.5]}, None, [], "gamma: 1.5 is out of range"),
        ({"gamma": [0]}, None, [], "gamma: 0.0 is out of range"),
        ({"horizon": [1.5]}, None, [], "horizon: expected an integer"),
        ({"policy": ["jsq", "bogus"]}, None, [], "policy: unknown policy 'bogus'"),
        ({"beta": [True]}, None, [], "beta: expected a number"),
        ({"limit": [10, 20]}, None, [], "limit: selects the trace"),
        (None, {"beta": [1, 2]}, [], "beta: [fixed] takes one value"),
        ({"beta": []}, None, [], "beta: [grid] gives no values"),
        ({"H": [1], "horizon": [2]}, None, [], "horizon: given twice"),
        (None, None, ["beta"], "expected name=v1,v2"),
        (None, None, ["r_max=0"], "r_max: 0 is out of range"),
        (None, None, ["workers=x"], "workers: 'x' is not a number"),
        (None, None, ["step_a=0", "step_b=0"], "step_a and step_b"),
    ],
)
def test_grid_errors_name_the_parameter(grid, fixed, options, message):
    with pytest.raises(GridError, match=None) as error:
        expand(build_spec(grid, fixed, options))
    assert message in str(error.value)


def test_grid_file_errors(tmp_path):
    with pytest.raises(GridError, match="unknown tables"):
        load_grid(_grid(tmp_path, "[grid]\nbeta = [1]\n[extra]\nx = 1\n"))
    with pytest.raises(GridError, match="not valid TOML"):
        load_grid(_grid(tmp_path, "[grid\n"))


def test_cell_keys_depend_on_the_trace_and_the_parameters_read():
    cells = expand(build_spec({"policy": ["brh-oracle", "jsq"], "beta": [20, 43]}))
    keys = [cell_key("trace-a", c) for c in cells]
    assert len(keys) == len(set(keys)) == 3  # jsq once
    again = expand(build_spec(None, None, ["policy=brh-oracle,jsq", "beta=20.0,43"]))
    assert [cell_key("trace-a", c) for c in again] == keys
    assert cell_key("trace-b", cells[0]) != keys[0]
    assert cell_key("trace-a", {**cells[0], "seed": 1}) != keys[0]
    small = Workload.from_arrays("x", [0.0, 1.0], [10, 20], [5, 6])
    moved = Workload.from_arrays("y", [0.0, 1.5], [10, 20], [5, 6])
    assert workload_digest(small) == workload_digest(Workload.from_arrays("z", *_arrays(small)))
    assert workload_digest(small) != workload_digest(moved)


def _arrays(w: Workload) -> tuple[np.ndarray, ...]:
    return (w.ready_s, w.prompt_tokens, w.output_tokens, w.prompt_keys)


# -- running, storing, resuming -----------------------------------------------------------


def test_sweep_stores_cells_resumes_and_exports_parquet(tmp_path):
    db, out = tmp_path / "s.duckdb", tmp_path / "cells.parquet"
    args = ["sweep", "synthetic:small", "--grid", str(_grid(tmp_path)), "--db", str(db)]
    first = runner.invoke(app, [*args, "--jobs", "1", "--parquet", str(out)])
    assert first.exit_code == 0, first.output
    assert f"running {GRID_CELLS} on this process" in first.output
    # its tables whole at 80 columns (a CI log): Rich cut them to 'brh-s…' and '732..…'
    assert "…" not in first.output and "brh-oracle" in first.output
    assert _count(db, "SELECT count(*) AS n FROM replay_runs") == GRID_CELLS
    assert _count(db, "SELECT count(*) AS n FROM sweep_cells") == GRID_CELLS
    assert _count(db, "SELECT count(*) AS n FROM replay_steps") == 0  # no --steps

    second = runner.invoke(app, [*args, "--jobs", "1"])
    assert second.exit_code == 0, second.output
    assert f"all {GRID_CELLS} cells stored already; nothing to run" in second.output
    assert _count(db, "SELECT count(*) AS n FROM replay_runs") == GRID_CELLS

    # A wider grid under another name reuses every stored cell and runs only the new ones.
    wider = runner.invoke(app, [*args, "--jobs", "1", "--param", "beta=20,43,60", "--dry-run"])
    assert wider.exit_code == 0, wider.output
    assert f"{GRID_CELLS} cells stored, 4 to run" in wider.output

    table = pq.read_table(out)
    assert table.num_rows == GRID_CELLS
    names = set(table.column_names)
    assert {"sweep", "cell_key", "run_id", "policy", "beta", "gamma", "seed", "horizon"} <= names
    assert {"throughput_tok_s", "tpot_p95_ms", "imbalance_mean", "steps"} <= names
    assert not names & {"sched_ms_p50", "sched_ms_p99"}  # wall time stays out
    rows = table.to_pylist()
    assert len({r["cell_key"] for r in rows}) == GRID_CELLS
    assert all(r["beta"] is None for r in rows if r["policy"] == "jsq")
    with open_database(db) as database:
        stored = {
            r["run_id"]: r for r in sweep_rows(EngineQuery(database.engine), rows[0]["sweep"])
        }
        summaries = {run: database.run_summaries(run) for run in stored}
    for row in rows:
        metrics = summaries[row["run_id"]][row["policy"]]
        assert row["throughput_tok_s"] == metrics["throughput_tok_s"]
        assert row["steps"] == metrics["steps"]
        assert row["requests"] == 60


def test_bad_grid_exits_2_naming_the_parameter(tmp_path):
    result = runner.invoke(
        app, ["sweep", "synthetic:small", "--param", "gamma=2", "--db", str(tmp_path / "s.db")]
    )
    assert result.exit_code == 2
    assert "gamma" in result.output


def test_steps_flag_stores_step_rows_and_a_failing_cell_spares_the_others(tmp_path):
    plan = plan_sweep("synthetic:small", build_spec(None, {"limit": 40, "G": 2, "B": 4}))
    assert plan.spec_json()["trace"] == "synthetic:small"
    assert plan.spec_json()["options"]["limit"] == 40
    with open_database(tmp_path / "s.duckdb") as database:
        report = run_sweep(plan, database, SerialExecutor(), steps=True)
        assert report.ran == 1 and not report.failed
        run_id = sweep_rows(EngineQuery(database.engine), plan.name)[0]["run_id"]
        steps = database.run_summaries(run_id)["brh-survival"]["steps"]
        assert len(database.step_series(run_id, "brh-survival")["start_ms"]) == steps
        assert database.worker_series(run_id, "brh-survival")[0].shape == (steps, 2)
    good = plan.cells[0]
    bad = CellTask("bad", good.workload, {**good.params, "policy": "nope"})
    outcomes = list(
        SerialExecutor().run([bad, CellTask(good.key, good.workload, good.params)], plan.workloads)
    )
    assert outcomes[0].result is None and "nope" in (outcomes[0].error or "")
    assert outcomes[1].result is not None


def test_pool_and_ray_give_identical_cells(tmp_path, monkeypatch):
    """The acceptance test: the same grid on the process pool and on a local Ray runtime
    (through the CLI) gives the same results cell for cell, and serially too; Ray gets
    each trace (one per seed) into its object store once, not once per cell."""
    ray = pytest.importorskip("ray")
    grid = _grid(tmp_path)
    tables = {}
    labels = {"jobs": "a process pool (2 processes)", "ray": "Ray (2 CPUs)"}
    puts: list[object] = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(value) or real_put(value, **kw))
    for executor in (["--jobs", "2"], ["--ray", "--jobs", "2"]):
        name = executor[0].strip("-")
        db, out = tmp_path / f"{name}.duckdb", tmp_path / f"{name}.parquet"
        result = runner.invoke(
            app,
            ["sweep", "synthetic:small", "--grid", str(grid), "--db", str(db),
             "--parquet", str(out), *executor],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert f"running {GRID_CELLS} on {labels[name]}" in result.output
        tables[name] = {r["cell_key"]: r for r in pq.read_table(out).to_pylist()}
    assert not ray.is_initialized()  # the sweep shut its own runtime down
    assert len(puts) == 2 and all(isinstance(w, Workload) for w in puts)  # two seeds

    plan = plan_sweep("synthetic:small", load_grid(grid))
    serial = results_by_key(
        {
            o.task.key: o.result
            for o in SerialExecutor().run(
                [CellTask(c.key, c.workload, c.params) for c in plan.cells], plan.workloads
            )
        }
    )
    assert set(tables["jobs"]) == set(tables["ray"]) == set(serial)
    for key, pool_row in tables["jobs"].items():
        ray_row = tables["ray"][key]
        for column, value in pool_row.items():
            if column != "run_id":
                assert ray_row[column] == value, (key, column)
        for metric, value in serial[key].items():
            if isinstance(value, float) and math.isnan(value):
                assert pool_row[metric] is None or math.isnan(pool_row[metric])
            else:
                assert pool_row[metric] == value, (key, metric)


# -- summaries and the heatmap --------------------------------------------------------------


def _row(policy, beta, gamma, seed, tput, tpot):
    params = {"policy": policy, "beta": beta, "gamma": gamma, "seed": seed, "horizon": 80}
    if policy == "jsq":
        params |= {"beta": None, "gamma": None, "horizon": None}
    return {"params": params, "metrics": {"throughput_tok_s": tput, "tpot_p95_ms": tpot}}


# brh-oracle over beta {20, 43} x gamma {0.8, 0.9}, two seeds each (means in comments).
ROWS = [
    _row("brh-oracle", 20.0, 0.8, 0, 940.0, 79.0),
    _row("brh-oracle", 20.0, 0.8, 1, 950.0, 79.6),  # 945, 79.3
    _row("brh-oracle", 20.0, 0.9, 0, 1000.0, 78.0),
    _row("brh-oracle", 20.0, 0.9, 1, 1000.0, 78.0),  # 1000, 78.0
    _row("brh-oracle", 43.0, 0.8, 0, 1010.0, 77.5),
    _row("brh-oracle", 43.0, 0.8, 1, 1030.0, 77.1),  # 1020, 77.3
    _row("brh-oracle", 43.0, 0.9, 0, 1043.0, 77.4),
    _row("brh-oracle", 43.0, 0.9, 1, 1043.0, 77.4),  # 1043, 77.4
    _row("jsq", None, None, 0, 780.0, 89.0),
    _row("jsq", None, None, 1, 790.0, 89.6),  # 785, 89.3
]


def test_summary_ranges_best_cells_and_sentences():
    oracle, jsq = summarize_sweep(ROWS)
    assert oracle["policy"] == "brh-oracle" and oracle["configs"] == 4
    assert oracle["seeds"] == [0, 1] and oracle["varied"] == ["beta", "gamma"]
    assert oracle["throughput_range"] == (945.0, 1043.0)
    assert oracle["tpot_p95_range"] == pytest.approx((77.3, 79.3))
    assert oracle["best"]["params"] == {"beta": 43.0, "gamma": 0.9}
    assert oracle["seed_spread_max"] == 20.0
    assert "throughput 945 to 1,043 tok/s" in oracle["sentence"]
    by_beta = oracle["params"][0]
    assert by_beta["param"] == "beta"
    low, high = by_beta["rows"]
    assert (low["value"], low["throughput_min"], low["throughput_max"]) == (20.0, 945.0, 1000.0)
    assert (low["best_throughput_tok_s"], low["best_at"]) == (1000.0, {"gamma": 0.9})
    assert (high["value"], high["throughput_min"], high["throughput_max"]) == (43.0, 1020.0, 1043.0)
    assert high["best_tpot_p95_ms"] == pytest.approx(77.4)
    # beta alone: 945 -> 1020 at gamma 0.8 (75), 1000 -> 1043 at gamma 0.9 (43).
    assert by_beta["alone_effect"] == 75.0
    assert "throughput stays within 945 to 1,043 tok/s across" not in by_beta["sentence"]
    assert by_beta["sentence"].startswith("across beta in [20, 43], throughput stays within 945")
    assert "beta alone moves it by at most 75 tok/s" in by_beta["sentence"]
    assert oracle["params"][1]["alone_effect"] == 55.0  # gamma: 945 -> 1000
    assert jsq["configs"] == 1 and jsq["params"] == [] and jsq["throughput_range"] == (785, 785)


def test_heatmap_means_over_seeds_and_fills_ignored_axes():
    oracle = heatmap(ROWS, "beta", "gamma", "throughput_tok_s", {"policy": "brh-oracle"})
    assert oracle["x"] == {"name": "beta", "values": [20.0, 43.0]}
    assert oracle["y"] == {"name": "gamma", "values": [0.8, 0.9]}
    assert oracle["z"] == [[945.0, 1020.0], [1000.0, 1043.0]]
    assert oracle["cells"] == 8
    jsq = heatmap(ROWS, "beta", "gamma", "tpot_p95_ms", {"policy": "jsq"})
    assert jsq["z"] == [[89.3, 89.3], [89.3, 89.3]]
    partial = heatmap(ROWS[:6], "beta", "gamma", "throughput_tok_s", {"policy": "brh-oracle"})
    assert partial["z"] == [[945.0, 1020.0], [1000.0, None]]
    seed0 = heatmap(ROWS, "beta", "gamma", "throughput_tok_s", {"policy": "brh-oracle", "seed": 0})
    assert seed0["z"][0] == [940.0, 1010.0]


def test_heatmap_api(tmp_path):
    from shadow.service.http import sweeps
    from shadow.service.http.state import service_store
    from shadow.service.store import ServiceStore

    db = tmp_path / "s.duckdb"
    plan = plan_sweep("synthetic:small", load_grid(_grid(tmp_path)), name="small")
    with open_database(db) as database:
        run_sweep(plan, database, SerialExecutor())
    store = ServiceStore(db)
    try:
        api = FastAPI()
        api.include_router(sweeps.router)
        api.dependency_overrides[service_store] = lambda: store
        with served(api) as client:
            listed = client.get("/v1/sweeps").json()["items"]
            assert [(s["name"], s["trace"], s["cells"]) for s in listed] == [
                ("small", "synthetic:small", GRID_CELLS)
            ]
            assert listed[0]["varied"] == ["policy", "beta", "gamma", "seed"]
            assert listed[0]["values"]["beta"] == [20.0, 43.0]

            got = client.get(
                "/v1/sweeps/small/heatmap",
                params={"x": "beta", "y": "gamma", "metric": "tpot_p95_ms", "policy": "brh-oracle"},
            )
            assert got.status_code == 200, got.text
            body = got.json()
            assert body["x"] == {"name": "beta", "values": [20.0, 43.0]}
            assert body["y"] == {"name": "gamma", "values": [0.8, 0.9]}
            assert body["metric"] == "tpot_p95_ms" and body["cells"] == 8
            rows = sweep_rows(store, "small")
            for j, gamma in enumerate(body["y"]["values"]):
                for i, beta in enumerate(body["x"]["values"]):
                    values = [
                        r["metrics"]["tpot_p95_ms"]
                        for r in rows
                        if r["params"]["policy"] == "brh-oracle"
                        and r["params"]["beta"] == beta
                        and r["params"]["gamma"] == gamma
                    ]
                    assert len(values) == 2
                    assert body["z"][j][i] == pytest.approx(sum(values) / 2, abs=1e-4)
            seed1 = client.get("/v1/sweeps/small/heatmap", params={"policy": "jsq", "seeds": "1"})
            assert seed1.status_code == 200 and seed1.json()["cells"] == 1

            assert client.get("/v1/sweeps/nope/heatmap").status_code == 404
            for bad in ({"x": "bogus"}, {"metric": "nope"}, {"x": "beta", "y": "beta"},
                        {"policy": "bogus"}, {"limit": "3"}):  # fmt: skip
                answer = client.get("/v1/sweeps/small/heatmap", params=bad)
                assert answer.status_code == 400, (bad, answer.text)
    finally:
        store.close()


def test_bench_sweep_reports_cells_per_minute(tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "sweep", "synthetic:small", "--limit", "30", "--seeds", "1", "--no-ray"]
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["cells"] == 9 and report["identical"] is True
    assert [(r["executor"], r["workers"]) for r in report["results"]] == [("pool", 1), ("pool", 2)]
    for r in report["results"]:
        assert r["cells_per_min"] == pytest.approx(60 * 9 / r["wall_s"])
        assert r["cpu_s"] > 0


def test_ray_takes_an_optional_address_as_the_issue_spells_it():
    from shadow.cli import ray_address_argv

    base = ["sweep", "synthetic:small", "--grid", "g.toml"]
    assert ray_address_argv([*base, "--ray"]) == [*base, "--ray"]
    assert ray_address_argv([*base, "--ray", "ray://head:10001"]) == [
        *base, "--ray", "--ray-address", "ray://head:10001"]  # fmt: skip
    assert ray_address_argv([*base, "--ray", "auto", "--jobs", "2"]) == [
        *base, "--ray", "--ray-address", "auto", "--jobs", "2"]  # fmt: skip
    assert ray_address_argv(["sweep", "--ray", "synthetic:small"]) == [
        "sweep", "--ray", "synthetic:small"]  # fmt: skip
