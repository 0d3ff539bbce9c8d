import json

from typer.testing import CliRunner

from shadow.cli import app

runner = CliRunner()


def test_bench_router_writes_the_documented_json(tmp_path):
    out = tmp_path / "router.json"
    result = runner.invoke(app, ["bench", "router", "--rounds", "10", "--json", str(out)])
    assert result.exit_code == 0, result.output
    cases = json.loads(out.read_text())["cases"]
    assert {(c["policy"], c["workers"], c["free_slots"]) for c in cases} == {
        (policy, workers, free)
        for policy in ("br0", "brh-survival")
        for workers, free in ((8, 8), (8, 64), (64, 64))
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


def test_bench_router_names_an_unknown_policy():
    result = runner.invoke(app, ["bench", "router", "--policies", "br0,nope"])
    assert result.exit_code == 2
    assert "nope" in result.output
