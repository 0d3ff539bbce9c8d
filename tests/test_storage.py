"""Storage: Alembic upgrades, atomic saves and exact round-trips on a real DuckDB file."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import zlib
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from shadow.service.store import DECISION_COLUMNS
from shadow.storage import (
    METRICS,
    Base,
    head_revision,
    migrations_dir,
    open_database,
    queries,
    upgrade,
)
from shadow.storage.database import _alembic_config

TABLES = {"replay_runs", "replay_policy_summaries", "replay_steps", "replay_worker_loads"}


def _run(**overrides: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "trace": "traces/azure-conv.jsonl",
        "workers": 8,
        "batch": 64,
        "requests": 5000,
        "a_ms_per_token": 0.00123,
        "b_ms": 7.5,
        "seed": 42,
        "config": {"policies": ["jsq", "br0"], "horizon": 16},
    }
    run.update(overrides)
    return run


def _replay(
    policies: list[str], n_steps: int, n_workers: int, seed: int = 0
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]], dict, dict]:
    rng = np.random.default_rng(seed)
    summaries: dict[str, dict[str, float]] = {}
    steps: dict[str, dict[str, np.ndarray]] = {}
    loads: dict[str, np.ndarray] = {}
    active: dict[str, np.ndarray] = {}
    for i, policy in enumerate(policies):
        wl = rng.integers(0, 2**40, (n_steps, n_workers), dtype=np.int64)
        wa = rng.integers(0, 64, (n_steps, n_workers), dtype=np.int32)
        loads[policy], active[policy] = wl, wa
        duration = rng.random(n_steps) * 30.0 + 1e-9
        steps[policy] = {
            "start_ms": np.concatenate([[0.0], np.cumsum(duration)[:-1]]),
            "duration_ms": duration,
            "max_load": wl.max(axis=1),
            "min_load": wl.min(axis=1),
            "sum_load": wl.sum(axis=1),
            "active": wa.sum(axis=1).astype(np.int32),
        }
        summaries[policy] = {m: rng.random() * 10**i for m in METRICS}
        summaries[policy]["steps"] = float(n_steps)
        summaries[policy]["output_tokens"] = float(wa.sum())
    return summaries, steps, loads, active


def _count(path: Path, table: str) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_open_creates_parent_and_tables_at_head(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "shadow.duckdb"
    with open_database(path) as db:
        assert db.revision() == head_revision()
        names = set(inspect(db.engine).get_table_names())
    assert names >= TABLES | {"alembic_version"}
    assert path.is_file()


def test_migration_matches_models(tmp_path: Path) -> None:
    """The explicit migration and the models must not drift apart (names, nullability)."""
    path = tmp_path / "s.duckdb"
    open_database(path).close()
    # DuckDB's own catalog: duckdb_engine's pg_catalog reflection fails on SQLAlchemy 2.1.
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute(
            "SELECT table_name, column_name, is_nullable FROM duckdb_columns()"
        ).fetchall()
        pks = con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY'"
        ).fetchall()
    for table in Base.metadata.sorted_tables:
        reflected = {col: nullable for tab, col, nullable in rows if tab == table.name}
        declared = {c.name: c.nullable for c in table.columns}
        assert reflected == declared, table.name
        db_pk = [list(cols) for tab, cols in pks if tab == table.name]
        model_pk = [c.name for c in table.primary_key.columns]
        assert db_pk == ([model_pk] if model_pk else []), table.name


def test_db_head_equals_script_head(tmp_path: Path) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    script_head = ScriptDirectory.from_config(cfg).get_current_head()
    assert script_head == head_revision() == "0015"
    with open_database(tmp_path / "s.duckdb") as db, db.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == script_head


def test_reopen_is_noop_and_keeps_data(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.duckdb"
    summaries, steps, loads, active = _replay(["jsq"], 10, 2)
    with open_database(path) as db:
        run_id = db.save_replay(_run(), summaries, steps, loads, active)
    caplog.set_level(logging.INFO, logger="alembic")
    caplog.clear()
    with open_database(path) as db:
        assert db.revision() == head_revision()
        assert [r["id"] for r in db.list_runs()] == [run_id]
    assert upgrade(path) == head_revision()
    assert not [r for r in caplog.records if "Running upgrade" in r.getMessage()]


def test_first_open_logs_the_upgrade(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="alembic")
    assert upgrade(tmp_path / "s.duckdb") == head_revision()
    assert any("Running upgrade  -> 0001" in r.getMessage() for r in caplog.records)


def test_round_trip_exact(tmp_path: Path) -> None:
    summaries, steps, loads, active = _replay(["jsq", "br0", "brh-survival"], 257, 8, seed=3)
    summaries["br0"]["tpot_p99_ms"] = math.nan  # NaN survives as NaN
    del summaries["jsq"]["sched_ms_p99"]  # missing metric stays missing
    created = datetime(2025, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    with open_database(tmp_path / "s.duckdb") as db:
        run_id = db.save_replay(
            _run(created_at=created, seed=None), summaries, steps, loads, active
        )
        got = db.run_summaries(run_id)
        assert set(got) == set(summaries)
        for policy, metrics in summaries.items():
            assert set(got[policy]) == set(metrics)
            for name, value in metrics.items():
                if math.isnan(value):
                    assert math.isnan(got[policy][name])
                else:
                    assert got[policy][name] == value  # bit-exact doubles, integral counts
        for policy in summaries:
            series = db.step_series(run_id, policy)
            assert set(series) == set(steps[policy])
            for key, arr in steps[policy].items():
                np.testing.assert_array_equal(series[key], arr)
            worker = db.worker_series(run_id, policy)
            assert worker is not None
            np.testing.assert_array_equal(worker[0], loads[policy])
            np.testing.assert_array_equal(worker[1], active[policy])
        (run,) = db.list_runs()
    assert run["id"] == run_id
    assert run["seed"] is None
    assert run["created_at"] == datetime(2025, 3, 1, 10, 0)  # stored as naive UTC
    assert run["config_json"] == '{"horizon": 16, "policies": ["jsq", "br0"]}'
    assert (run["workers"], run["batch"], run["requests"]) == (8, 64, 5000)
    assert (run["a_ms_per_token"], run["b_ms"]) == (0.00123, 7.5)
    assert run["tool_version"]


def test_bulk_series_round_trip(tmp_path: Path) -> None:
    summaries, steps, loads, active = _replay(["jsq", "br0"], 100_000, 4, seed=7)
    with open_database(tmp_path / "s.duckdb") as db:
        run_id = db.save_replay(_run(), summaries, steps, loads, active)
        for policy in ("jsq", "br0"):
            series = db.step_series(run_id, policy)
            assert len(series["start_ms"]) == 100_000
            for key, arr in steps[policy].items():
                np.testing.assert_array_equal(series[key], arr)
            worker = db.worker_series(run_id, policy)
            assert worker is not None
            np.testing.assert_array_equal(worker[0], loads[policy])
            np.testing.assert_array_equal(worker[1], active[policy])
    assert _count(tmp_path / "s.duckdb", "replay_steps") == 200_000
    assert _count(tmp_path / "s.duckdb", "replay_worker_loads") == 800_000


def test_steps_without_worker_series(tmp_path: Path) -> None:
    summaries, steps, _, _ = _replay(["jsq"], 50, 2)
    with open_database(tmp_path / "s.duckdb") as db:
        run_id = db.save_replay(_run(), summaries, steps, None, None)
        assert len(db.step_series(run_id, "jsq")["active"]) == 50
        assert db.worker_series(run_id, "jsq") is None
        with pytest.raises(KeyError):
            db.step_series(run_id + 1, "jsq")


def _assert_empty(path: Path) -> None:
    for table in TABLES:
        assert _count(path, table) == 0, table


@pytest.mark.parametrize(
    "breakage",
    ["step_lengths", "worker_shape", "lossy_load", "null_policy"],
)
def test_failed_save_leaves_no_partial_run(tmp_path: Path, breakage: str) -> None:
    """Each failure happens after the run row (and some series) were written."""
    path = tmp_path / "s.duckdb"
    summaries, steps, loads, active = _replay(["jsq", "br0"], 100, 4)
    if breakage == "step_lengths":
        steps["br0"]["duration_ms"] = steps["br0"]["duration_ms"][:-1]
    elif breakage == "worker_shape":
        active["br0"] = active["br0"][:, :3]
    elif breakage == "lossy_load":
        steps["br0"]["max_load"] = steps["br0"]["max_load"] + 0.5
    else:  # rejected by DuckDB itself (NOT NULL), not by our validation
        steps[None] = steps.pop("br0")  # type: ignore[index]
    with open_database(path) as db:
        with pytest.raises((ValueError, duckdb.Error)):
            db.save_replay(_run(), summaries, steps, loads, active)
        assert db.list_runs() == []
        assert db.run_summaries(1) == {}
    _assert_empty(path)
    with open_database(path) as db:  # the database is still usable afterwards
        good = _replay(["jsq"], 10, 2)
        run_id = db.save_replay(_run(), *good)
        assert [r["id"] for r in db.list_runs()] == [run_id]


def test_input_validation(tmp_path: Path) -> None:
    summaries, steps, loads, active = _replay(["jsq"], 10, 2)
    with open_database(tmp_path / "s.duckdb") as db:
        with pytest.raises(ValueError, match="unknown metrics"):
            db.save_replay(_run(), {"jsq": {"p999": 1.0}}, steps, loads, active)
        with pytest.raises(ValueError, match="integral"):
            db.save_replay(_run(), {"jsq": {"steps": 1.5}}, steps, loads, active)
        with pytest.raises(ValueError, match="same policies"):
            db.save_replay(_run(), summaries, steps, loads, None)
        with pytest.raises(ValueError, match="missing"):
            db.save_replay({"trace": "x"}, summaries, steps)
        with pytest.raises(ValueError, match="exactly one"):
            db.save_replay(_run(config_json="{}"), summaries, steps)
        bad = {"jsq": {**steps["jsq"], "extra": np.zeros(10)}}
        with pytest.raises(ValueError, match="unknown"):
            db.save_replay(_run(), summaries, bad)
        assert db.list_runs() == []


def test_two_runs_get_distinct_ids(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    a = _replay(["jsq"], 20, 2, seed=1)
    b = _replay(["jsq"], 30, 2, seed=2)
    with open_database(path) as db:
        first = db.save_replay(_run(trace="a"), *a)
    with open_database(path) as db:
        second = db.save_replay(_run(trace="b"), *b)
        assert first != second
        runs = db.list_runs()
        assert [(r["id"], r["trace"]) for r in runs] == [(first, "a"), (second, "b")]
        assert len(db.step_series(first, "jsq")["start_ms"]) == 20
        assert len(db.step_series(second, "jsq")["start_ms"]) == 30
        assert runs[0]["created_at"] <= datetime.now(UTC).replace(tzinfo=None)


def test_full_size_replay_saves_every_row(tmp_path: Path) -> None:
    """20,000 steps x 8 workers x 9 policies: 1.44 M worker rows in one bulk save."""
    policies = [f"p{i}" for i in range(9)]
    data = _replay(policies, 20_000, 8)
    with open_database(tmp_path / "s.duckdb") as db:
        db.save_replay(_run(), *data)
    assert _count(tmp_path / "s.duckdb", "replay_worker_loads") == 1_440_000


def test_path_with_url_special_characters(tmp_path: Path) -> None:
    """'%41', '#' and spaces in a path must not be URL-decoded into another file name."""
    path = tmp_path / "odd dir" / "a%41b #1.duckdb"
    assert upgrade(path) == head_revision()
    assert [p.name for p in path.parent.iterdir()] == ["a%41b #1.duckdb"]


def test_decision_snapshots_once_per_dispatch_migrate_both_ways(tmp_path: Path) -> None:
    """0014 lets a dispatch's other decision rows hold no snapshot; going back to 0013
    gives each of them its dispatch's snapshot (what the code before reads)."""
    path = tmp_path / "s.duckdb"
    open_database(path).close()
    columns = ", ".join((*DECISION_COLUMNS[:-1], "snapshot"))  # as stored before 0015
    with duckdb.connect(str(path)) as con:
        for policy, snapshot in (("br0", '{"loads": [1, 2]}'), ("jsq-pool", None)):
            row = [7, "f", 1.0, "r", 10, "w0", "jsq", policy, "w1", False, 0.0, 0.0, 0.0,
                   0.0, 0.0, 0.0, True, None, None, snapshot]  # fmt: skip
            con.execute(f"INSERT INTO decisions ({columns}) VALUES "
                        f"({', '.join('?' * len(row))})", row)  # fmt: skip
    cfg = _alembic_config(f"duckdb:///{path}")
    command.downgrade(cfg, "0013")
    with duckdb.connect(str(path)) as con:
        stored = con.execute("SELECT policy, snapshot FROM decisions ORDER BY policy").fetchall()
    assert stored == [("br0", '{"loads": [1, 2]}'), ("jsq-pool", '{"loads": [1, 2]}')]


def test_compressed_snapshots_migrate_both_ways_and_read_as_the_json_before(
    tmp_path: Path,
) -> None:
    """Since 0015 a snapshot is stored as JSON bytes in `snapshot_z`, zlib-compressed when
    large; a row stored before keeps its JSON in `snapshot`. Readers show all alike, and
    going back to 0014 turns the bytes back into JSON text (what the code before reads)."""
    path = tmp_path / "s.duckdb"
    open_database(path).close()
    new = '{"workers":["a","b"],"loads":[5,2],"active":[1,1],"capacity":[4,4],"f_brh":[1.5,2.5]}'
    small = '{"workers":["a","b"],"loads":[1,1],"active":[1,1],"capacity":[4,4],"f_brh":[0,0]}'
    old = '{"workers":["a","b"],"loads":[3,9],"active":[2,0],"capacity":[4,4],"f_brh":[0.5,0.0]}'
    with duckdb.connect(str(path)) as con:
        for ingest_id, column, value in ((7, "snapshot_z", zlib.compress(new.encode(), 1)),
                                         (8, "snapshot", old),
                                         (9, "snapshot_z", small.encode())):  # fmt: skip
            con.execute(
                "INSERT INTO decisions (ingest_id, fleet, ts, request_id, prompt_tokens, "
                "incumbent_worker, incumbent_policy, policy, agrees, f_br0_incumbent, "
                f"f_br0_best, f_brh_incumbent, f_brh_best, mirror_jsq_agrees, {column}) "
                "VALUES (?, 'f', 1.0, 'r', 4, 'a', 'jsq', 'br0', true, 0, 0, 0, 0, true, ?)",
                [ingest_id, value],
            )
        stored = dict(
            con.execute(
                f"SELECT ingest_id, {queries.STORED_SNAPSHOT} FROM decisions ORDER BY 1"
            ).fetchall()
        )
    shown = {i: queries.complete_snapshot(blob, 4) for i, blob in stored.items()}
    assert shown[7]["loads"] == [5, 2] and shown[7]["margins"] == [0, 3]
    assert shown[8]["loads"] == [3, 9] and shown[8]["f_br0"] == [4 - 2 * 0, 4 - 2 * 4]
    assert shown[9]["loads"] == [1, 1]
    command.downgrade(_alembic_config(f"duckdb:///{path}"), "0014")
    with duckdb.connect(str(path)) as con:
        back = con.execute("SELECT ingest_id, snapshot FROM decisions ORDER BY 1").fetchall()
        columns = {c[0] for c in con.execute("DESCRIBE decisions").fetchall()}
    assert back == [(7, new), (8, old), (9, small)] and "snapshot_z" not in columns


_PROGRESS_BAR_SETTINGS = """
import sys
import zlib
from sqlalchemy import text
from shadow.storage.database import open_database
setting = text("SELECT current_setting('enable_progress_bar')")
with open_database(sys.argv[1]) as db, db.engine.connect() as first:
    with db.engine.connect() as second:
        assert first.connection.dbapi_connection is not second.connection.dbapi_connection
        print(first.execute(setting).scalar(), second.execute(setting).scalar())
"""


def test_no_progress_bar_on_any_connection(tmp_path: Path) -> None:
    """DuckDB draws its bar on stdout for any query past 2 s, on every connection unless
    that connection is told not to: the service's and CI's logs filled with it (seen in
    `bench fleet`). In a child process, since DuckDB turns the bar off by itself under
    pytest; two connections at once, so the pool opens a second one."""
    done = subprocess.run(
        [sys.executable, "-c", _PROGRESS_BAR_SETTINGS, str(tmp_path / "r.duckdb")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["False", "False"]
