import io
import json
import subprocess
import sys

import duckdb
import pytest
from rich.console import Console
from typer.testing import CliRunner

from shadow.bench import fleet_samples
from shadow.cli import app, bench_fleet, shared
from shadow.service.settings import load_settings

runner = CliRunner()


def test_bench_router_writes_the_documented_json(tmp_path):
    out = tmp_path / "router.json"
    result = runner.invoke(app, ["bench", "router", "--rounds", "10", "--json", str(out)])
    assert result.exit_code == 0, result.output
    cases = json.loads(out.read_text())["cases"]
    assert {(c["policy"], c["workers"], c["free_slots"]) for c in cases} == {
        (policy, workers, free)
        for policy in ("br0", "brh-survival")
        for workers, free in ((8, 8), (8, 64), (64, 64), (256, 256))
    }
    for case in cases:
        assert set(case) >= {
            "policy",
            "workers",
            "batch",
            "pool",
            "free_slots",
            "p50_ms",
            "p99_ms",
            "max_ms",
        }
        assert 0 < case["p50_ms"] <= case["p99_ms"] <= case["max_ms"]
        # a round's CPU time is at most its wall time, so its percentiles are too (plus
        # the clocks' resolution)
        assert 0 < case["cpu_p50_ms"] <= case["cpu_p99_ms"] <= case["p99_ms"] + 0.1


def test_bench_router_names_an_unknown_policy():
    result = runner.invoke(app, ["bench", "router", "--policies", "br0,nope"])
    assert result.exit_code == 2
    assert "nope" in result.output


REPORT_FIELDS = {
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
}


def replay_args(tmp_path, name, *extra):
    return [
        "replay",
        "synthetic:small",
        "--workers",
        "4",
        "--batch",
        "8",
        "--no-db",
        "--json",
        str(tmp_path / name),
        *extra,
    ]


def test_replay_json_has_the_documented_schema(tmp_path):
    result = runner.invoke(
        app,
        replay_args(
            tmp_path,
            "a.json",
            "--policies",
            "jsq,br0,brh-oracle",
            "--step-a",
            "0.0002",
            "--step-b",
            "10",
            "--timing",
        ),
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["schema"] == 1
    assert report["workers"] == 4 and report["batch"] == 8 and report["requests"] == 200
    assert report["step_model"] == {"a_ms_per_token": 0.0002, "b_ms": 10.0}
    assert report["trace"].startswith("synthetic:small")
    assert list(report["policies"]) == ["jsq", "br0", "brh-oracle"]
    for metrics in report["policies"].values():
        assert set(metrics) == REPORT_FIELDS
        assert metrics["sched_ms_p50"] is not None  # measured with --timing
        assert metrics["output_tokens"] > 0 and metrics["steps"] > 0


def test_same_seed_gives_byte_identical_json(tmp_path):
    for name in ("a.json", "b.json"):
        result = runner.invoke(
            app, replay_args(tmp_path, name, "--policies", "random,p2c,brh-survival", "--seed", "3")
        )
        assert result.exit_code == 0, result.output
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    other = runner.invoke(
        app, replay_args(tmp_path, "c.json", "--policies", "random,p2c,brh-survival", "--seed", "4")
    )
    assert other.exit_code == 0
    assert (tmp_path / "a.json").read_bytes() != (tmp_path / "c.json").read_bytes()


def test_replay_decides_on_arrival_when_asked(tmp_path):
    """`--decide-on-arrival` is the engine's on-arrival decision (the demo check's truth),
    not the default round before each step."""
    from shadow.analysis.metrics import summarize
    from shadow.policies import make_policy
    from shadow.replay import replay
    from shadow.replay.workload import StepModel
    from shadow.workloads.synthetic import generate

    for name, extra in (("steps.json", ()), ("arrival.json", ("--decide-on-arrival",))):
        result = runner.invoke(app, replay_args(tmp_path, name, "--policies", "jsq,br0", *extra))
        assert result.exit_code == 0, result.output
    steps, arrival = (
        json.loads((tmp_path / n).read_text())["policies"] for n in ("steps.json", "arrival.json")
    )
    truth = summarize(
        replay(generate("small", seed=0), make_policy("br0"), workers=4, batch=8,
               step_model=StepModel(), decide_on_arrival=True)
    )  # fmt: skip
    got = arrival["br0"].get("metrics", arrival["br0"])
    before = steps["br0"].get("metrics", steps["br0"])
    assert got["imbalance_mean"] == round(truth["imbalance_mean"], 4)  # the JSON's 4 places
    assert before["imbalance_mean"] != got["imbalance_mean"]


def test_replay_emits_the_first_policys_event_stream(tmp_path):
    events_file = tmp_path / "events.jsonl"
    result = runner.invoke(
        app,
        replay_args(
            tmp_path,
            "a.json",
            "--policies",
            "jsq,br0",
            "--emit-events",
            str(events_file),
            "--progress-every",
            "32",
        ),
    )
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert {e["type"] for e in events} == {
        "worker",
        "ready",
        "dispatch",
        "progress",
        "finish",
        "engine_step",
    }
    assert {e["policy"] for e in events if e["type"] == "dispatch"} == {"jsq"}
    assert sum(e["type"] == "finish" for e in events) == 200


def test_replay_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("ready_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,abc,5\n")
    result = runner.invoke(app, ["replay", str(bad), "--no-db"])
    assert result.exit_code == 1
    assert "line 3" in result.output and "prompt_tokens" in result.output
    skipped = runner.invoke(app, ["replay", str(bad), "--no-db", "--skip-bad", "--policies", "jsq"])
    assert skipped.exit_code == 0, skipped.output
    assert "skipped 1 malformed" in skipped.output
    unknown = runner.invoke(app, ["replay", "synthetic:nope", "--no-db"])
    assert unknown.exit_code == 2 and "paper-azure2024" in unknown.output
    both = runner.invoke(app, ["replay", "synthetic:small", "--load", "1", "--rate-scale", "2"])
    assert both.exit_code == 2


def test_errors_are_whole_lines_with_a_long_path(tmp_path):
    """A CI runner's temporary path is long; off a terminal nothing is wrapped at 80
    columns, so the path, the line number and the field stay on one line: the same replay
    error as above, a usage error (Typer's panel would cut it), and the gate's ERROR."""
    import os
    import subprocess
    import sys

    from shadow.world.process import REPO

    deep = tmp_path.joinpath(*(["a-directory-with-a-long-name"] * 6))
    deep.mkdir(parents=True)
    bad = deep / "bad.csv"
    bad.write_text("ready_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,abc,5\n")
    assert len(str(bad)) > 200
    result = runner.invoke(app, ["replay", str(bad), "--no-db"])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if "line 3" in line]
    assert str(bad) in line and "prompt_tokens" in line
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(REPO)}
    for args, code, words in [
        (["replay", str(bad), "--policies", "nope"], 2, ["--policies", "nope", "brh-oracle"]),
        (["gate", "--db", str(deep / "missing.duckdb")], 5, ["evidence missing", "missing.duckdb"]),
    ]:
        run = subprocess.run([sys.executable, "-m", "shadow.cli", *args], capture_output=True,
                             text=True, cwd=REPO, env=env, timeout=120)  # fmt: skip
        assert run.returncode == code, run.stderr
        (line,) = [line for line in run.stderr.splitlines() if words[0] in line]
        assert all(word in line for word in words), run.stderr
        assert "\u2502" not in run.stderr  # no panel border


def test_replay_stores_the_run_in_duckdb_and_db_upgrade_is_idempotent(tmp_path):
    from shadow.storage import open_database

    db = tmp_path / "runs" / "shadow.duckdb"
    result = runner.invoke(
        app,
        [
            "replay",
            "synthetic:small",
            "--workers",
            "4",
            "--batch",
            "8",
            "--policies",
            "jsq,br0",
            "--db",
            str(db),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "stored as run" in result.output
    with open_database(db) as database:
        runs = database.list_runs()
        assert len(runs) == 1 and runs[0]["workers"] == 4
        summaries = database.run_summaries(runs[0]["id"])
        assert set(summaries) == {"jsq", "br0"}
        series = database.step_series(runs[0]["id"], "br0")
        assert len(series["start_ms"]) == summaries["br0"]["steps"]
        loads, active = database.worker_series(runs[0]["id"], "br0")
        assert loads.shape == (summaries["br0"]["steps"], 4) and (active <= 8).all()
    upgraded = runner.invoke(app, ["db", "upgrade", "--db", str(db)])
    assert upgraded.exit_code == 0 and "0015" in upgraded.output


def test_bench_fleet_reports_rates_audit_and_storage(tmp_path):
    """A small fleet, file pass only: the report's numbers hang together."""
    out = tmp_path / "fleet.json"
    result = runner.invoke(app, ["bench", "fleet", "--workers", "8", "--batch", "8",
                                 "--minutes", "0.3", "--no-http", "--workdir", str(tmp_path),
                                 "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["events"] == sum(report["by_kind"].values())
    assert report["by_kind"]["worker"] == 8
    assert report["by_kind"]["dispatch"] == report["by_kind"]["ready"] > 0
    assert report["fleet_seconds"] <= 0.3 * 60
    assert report["required_events_per_s"] == report["events"] / report["fleet_seconds"]
    assert report["audit"]["audited"] == report["by_kind"]["dispatch"]
    assert report["file"]["events"] == report["events"]
    assert report["file"]["ratio"] > 0
    # what the service holds at the end: every request it saw, live or remembered as
    # finished (18 s of fleet time, well inside finished_ttl_s)
    held = report["file"]["held_requests_end"]
    assert held["live"] + held["finished"] == report["by_kind"]["ready"], held
    assert held["finished"] == report["by_kind"].get("finish", 0), held
    assert "requests held at the end" in result.output
    assert report["gib_per_day"] > 0
    assert "GiB per day" in result.output and "required real-time rate" in result.output


def test_bench_fleet_runs_the_counterfactuals_when_asked(tmp_path):
    out = tmp_path / "fleet.json"
    result = runner.invoke(app, ["bench", "fleet", "--workers", "8", "--batch", "8",
                                 "--minutes", "0.3", "--no-http", "--counterfactuals",
                                 "--workdir", str(tmp_path), "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["counterfactuals"] == "on"
    assert "continuous counterfactuals: on" in result.output
    # the last sample's count of evaluated windows is what the pass's database holds
    last = report["file"]["samples"][-1]
    with duckdb.connect(str(tmp_path / "fleet-file.duckdb"), read_only=True) as con:
        stored, end = con.execute("SELECT count(*), max(t_end) FROM windows").fetchone()
    assert last["windows"] == stored
    assert last["counterfactual_lag_s"] == (
        None if end is None else max(0.0, last["fleet_s"] - end)
    )


def test_bench_fleet_http_pass_finds_every_acknowledged_event_stored_once(tmp_path):
    """The HTTP pass at the fleet's real-time rate (12 s of a small fleet): its stored
    check reads the pass's database, and agrees with the stream it sent."""
    out = tmp_path / "fleet.json"
    result = runner.invoke(app, ["bench", "fleet", "--workers", "4", "--batch", "8",
                                 "--minutes", "0.2", "--workdir", str(tmp_path),
                                 "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    http = report["http"]
    assert http["failed_batches"] == 0
    check = http["stored"]
    kinds = report["by_kind"]
    assert check["mismatched"] == {} and check["duplicates"] == 0, check
    assert check["stored"]["dispatch"] == kinds["dispatch"] > 0
    assert check["stored"]["engine_step"] == kinds["engine_step"]
    assert "progress" not in check["stored"]  # kept as each request's latest, counted apart
    assert 0 < check["progress_requests"] <= kinds["ready"]
    assert check["decisions"] == 3 * kinds["dispatch"]  # jsq-pool, br0, brh-survival
    assert "stored once: mismatched none, duplicates 0" in " ".join(result.output.split())


def test_bench_fleet_passes_the_audit_backlog_bound_to_the_service(tmp_path):
    """--max-audit-backlog reaches the pass's service settings; the report counts skips."""
    out = tmp_path / "fleet.json"
    result = runner.invoke(app, ["bench", "fleet", "--workers", "8", "--batch", "8",
                                 "--minutes", "0.2", "--no-http", "--audit-sampling",
                                 "--max-audit-backlog", "4", "--workdir", str(tmp_path),
                                 "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    settings = load_settings(tmp_path / "fleet-file.toml", db=tmp_path / "x.duckdb")
    assert settings.limits.max_audit_backlog == 4
    file_pass = json.loads(out.read_text())["file"]
    assert file_pass["audit_sampling"] is True
    assert f"{file_pass['audit_skipped']:,} dispatches skipped" in result.output
    refused = runner.invoke(app, ["bench", "fleet", "--max-audit-backlog", "1", "--no-http"])
    assert refused.exit_code == 2 and "max-audit-backlog" in refused.output


def test_bench_fleet_samples_fit_a_ci_log_without_cutting_a_number() -> None:
    """G = 256's samples at 80 columns (a CI log has no terminal): every number whole."""
    samples = [
        {"fleet_s": t, "wall_s": t * 0.41, "audit_lag_s": 20.37, "behind_s": 0.0,
         "windows": t // 60, "counterfactual_lag_s": None if t < 150 else 150.0,
         "rss_mib": {"server": 1_100.0, "worker-0": 95.0, "worker-1": 98.0},
         "held": {"live": 43_162, "finished": 111_988 + t, "windows": 97_400}}
        for t in range(30, 301, 30)
    ]  # fmt: skip
    out = io.StringIO()  # the console's width: 80 here, as in a CI log, unless COLUMNS says
    width = shared.console.width
    Console(file=out, width=width).print(bench_fleet._samples_table("http", samples, 30.0))
    text = out.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    last = next(line for line in text.splitlines() if line.split()[:1] == ["300"])
    assert last.split() == ["300", "123.0", "20.37", "0.00", "5", "150", "1,293", "43.2",
                            "112.3", "97.4"], text  # fmt: skip


def test_replay_tables_name_every_policy_whole_in_a_ci_log() -> None:
    """At 80 columns Rich cut the longest policy name to 'vllm-dplb-lega…' and 'jsq-po…'."""
    names = "vllm-dplb-legacy,ascend-proxy,jsq-pool,jsq"
    result = runner.invoke(app, ["replay", "synthetic:small", "--limit", "60",
                                 "--policies", names])  # fmt: skip
    assert result.exit_code == 0, result.output
    width = shared.console.width  # 80 here, as in a CI log, unless COLUMNS says otherwise
    assert "…" not in result.output and max(map(len, result.output.splitlines())) <= width
    table_rows = [line for line in result.output.splitlines() if line.startswith("│")]
    named = [row.split("│")[1].strip() for row in table_rows]
    assert named == names.split(",") * 2, result.output  # the headline, then the detail


def test_a_sized_table_wraps_text_before_it_cuts_a_number() -> None:
    """`bench ingest`'s table: whole, it is 88 columns; its headers wrapped, still 85;
    with the text cells wrapped too, it fits 80 and every number is whole."""
    rows = [["file", "377,664", "46", "7.03", "8.17", "46,227", ">= 50,000 [red]MISSED"],
            ["http (batches of 1000)", "377,664", "46", "9.21", "10.09", "37,430",
             ">= 20,000 [green]ok"]]  # fmt: skip
    headers = ["path", "events", "windows", "acknowledged at, s", "seconds", "events/s", "target"]
    out = io.StringIO()
    Console(file=out, width=80).print(shared.sized_table("Ingest", headers, rows, width=80))
    text = out.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80, text
    for number in ("377,664", "7.03", "10.09", "46,227", "37,430", "50,000", "20,000"):
        assert number in text, (number, text)


def test_bench_fleet_growth_by_process_does_not_count_a_late_start() -> None:
    """The window worker starts with the first due window (~2 minutes in): the total's
    slope counts its start as growth, its own slope from its first sample does not."""
    samples = [
        fleet_samples.Sample(
            fleet_s=t,
            wall_s=t,
            events=int(t) * 100,
            audit_lag_s=0.0,
            behind_s=0.0,
            cpu_s={"server": t / 10},
            rss_mib={"server": 500.0 + t / 60} | ({"worker-1": 160.0} if t >= 120 else {}),
        )
        for t in range(30, 301, 30)
    ]
    summary = fleet_samples.summarize_pass(samples, 30_000, 300.0, 100.0)
    by_process = summary["growth_mib_per_min_by_process"]
    assert by_process["server"] == pytest.approx(1.0)
    assert by_process["worker-1"] == pytest.approx(0.0, abs=1e-9)
    assert summary["growth_mib_per_min_after_1_min"] > 20  # the start, read as growth


#: what pip's `shadow` console script does, then one spawned worker asked what it loaded
CONSOLE_SCRIPT = """
import sys
from shadow.cli import main
if __name__ == "__main__":
    sys.argv = ["shadow", "version"]
    try:
        main()
    except SystemExit:
        pass
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(pool.apply(eval, ("'shadow.cli' in __import__('sys').modules",)))
"""


def test_workers_spawned_under_the_console_script_do_not_rerun_it(tmp_path):
    """A spawned worker re-runs a main script by its path; the `shadow` script imports
    the whole command line, 26 MiB in every audit and window worker for nothing."""
    script = tmp_path / "shadow"
    script.write_text(CONSOLE_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    )
    *_, worker_loaded_cli = done.stdout.split()
    assert worker_loaded_cli == "False", done.stdout + done.stderr


def test_command_lists_show_each_summary_as_one_paragraph() -> None:
    """Typer's Rich mode kept a docstring's line breaks in the command list, so a summary
    wrapped in the source broke mid-sentence at 80 columns (`bench demo`, `bench fleet`)."""
    import typer
    import typer.main
    from typer.core import TyperGroup

    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    ctx = typer.Context(group)
    bench = group.get_command(ctx, "bench")
    assert isinstance(bench, TyperGroup)
    for name in bench.list_commands(ctx):
        command = bench.get_command(ctx, name)
        assert command is not None and command.short_help, name
        assert "\n" not in command.short_help, name
    fleet = bench.get_command(ctx, "fleet")
    assert fleet is not None and fleet.short_help is not None
    assert fleet.short_help.startswith("Keep pace with a wide-EP fleet: generate its event "
                                       "stream, time the audit per dispatch, ingest")  # fmt: skip
    tap = group.get_command(ctx, "tap")
    assert tap is not None and tap.short_help is not None and "\n" not in tap.short_help
