"""A real Prometheus (Debian's `prometheus`, installed by .ci/run) scrapes a running demo
service; every PromQL expression of every committed dashboard must be valid and return
series, and `promtool check metrics` must accept the exposition."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import httpx
import pytest

from shadow.dashboards import promql_expressions
from shadow.world.process import REPO, ServerProcess, free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
if PROMETHEUS is None or PROMTOOL is None:
    raise RuntimeError(
        "the metrics integration test needs Debian's prometheus and promtool: "
        "apt-get install prometheus (.ci/run does)"
    )

VARIABLES = {
    "$__rate_interval": "30s",
    "$__interval": "15s",
    "$__range": "5m",
    "${datasource}": "",
    "$datasource": "",
    "${fleet}": "default",
    "$fleet": "default",
    "${policy:regex}": ".*",
    "${policy}": ".*",
    "$policy": ".*",
    "${worker:regex}": ".*",
    "${worker}": ".*",
    "$worker": ".*",
}


def expand(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unexpanded variable in {expr}"
    return expr


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    root = tmp_path_factory.mktemp("prometheus")
    service = ServerProcess(root / "demo.duckdb", demo=True).start()
    port = free_port()
    (root / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: shadow\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{service.port}']\n"
    )
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
         f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        yield service, url
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        service.stop()


def query(url: str, expr: str) -> dict:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    return response.json()


def test_promtool_accepts_the_exposition(scraped):
    service, _ = scraped
    exposition = httpx.get(f"{service.url}/metrics", timeout=10).text
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not checked.stdout.strip(), checked.stdout  # no lint findings either


def test_every_dashboard_expression_is_valid_and_returns_series(scraped):
    _, url = scraped
    expressions = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        expressions += [(path.name, e) for e in promql_expressions(dashboard)]
    assert len(expressions) >= 20
    deadline = time.monotonic() + 150
    missing: list[tuple[str, str, str]] = []
    while True:
        missing = []
        for name, expr in expressions:
            answer = query(url, expand(expr))
            if answer.get("status") != "success":
                pytest.fail(f"{name}: invalid PromQL {expr!r}: {answer.get('error')}")
            if not answer["data"]["result"]:
                missing.append((name, expr, expand(expr)))
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert not missing, "no series for:\n" + "\n".join(f"{n}: {e}" for n, e, _ in missing)


def test_the_dashboards_use_only_exported_metrics(scraped):
    service, _ = scraped
    exposition = httpx.get(f"{service.url}/metrics", timeout=10).text
    exported = set(
        re.findall(r"^(shadow_[a-z0-9_]+?)(?:_bucket|_sum|_count)?[{ ]", exposition, re.M)
    )
    exported |= {name + suffix for name in exported for suffix in ("_bucket", "_sum", "_count")}
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for expr in promql_expressions(json.loads(path.read_text())):
            for name in re.findall(r"\bshadow_[a-z0-9_]+", expr):
                assert name in exported, f"{path.name}: {name} is not exported"
