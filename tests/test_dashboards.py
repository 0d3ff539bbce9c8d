"""The Grafana dashboards: the committed JSON is what the code builds, it is a valid Grafana
dashboard model, every query reads only exported metrics and declared variables, and
provisioning is idempotent against a recording imitation of Grafana's HTTP API."""

from __future__ import annotations

import enum
import json
import re
import socket
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dashboard_model
from grafana_foundation_sdk.models import prometheus as prometheus_model
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from shadow import dashboards
from shadow.cli import app
from shadow.dashboards import provisioning
from tests.service_helpers import ThreadedServer

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "dashboards"

#: The metric names of shadow/service/metrics.py as Prometheus exposes them.
METRICS = {
    "shadow_events_total", "shadow_events_rejected_total", "shadow_mirror_kv_tokens",
    "shadow_mirror_active_requests", "shadow_pool_requests", "shadow_observed_imbalance_tokens",
    "shadow_observed_gap_tokens", "shadow_mirror_state_mismatches_total",
    "shadow_late_events_total",
    "shadow_window_imbalance_tokens", "shadow_window_gap_tokens",
    "shadow_window_throughput_tokens_per_second", "shadow_window_tpot_p95_seconds",
    "shadow_window_step_seconds", "shadow_window_ratio", "shadow_replay_fidelity_ratio",
    "shadow_step_model_seconds_per_token", "shadow_step_model_fixed_seconds",
    "shadow_decision_agreement_ratio", "shadow_decision_regret_tokens",
    "shadow_decisions_total", "shadow_invariant_violations_total", "shadow_mode",
    "shadow_fallback_trips", "shadow_route_decision_seconds_bucket",
    "shadow_route_decision_seconds_sum", "shadow_route_decision_seconds_count",
    "shadow_telemetry_age_seconds", "shadow_telemetry_stale",
}  # fmt: skip
FUNCTIONS = {"sum", "max", "min", "avg", "count", "rate", "increase", "histogram_quantile",
             "vector"}  # fmt: skip
KEYWORDS = {"by", "without", "or", "and", "unless", "on", "ignoring", "bool", "offset"}
VARIABLES = {"datasource", "fleet", "policy", "worker"}
BUILTINS = {"__rate_interval", "__interval", "__range"}
UIDS = {"shadow-overview", "shadow-per-worker", "shadow-decisions", "shadow-integrity"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TOKEN = "glsa_test_token"


@pytest.fixture(scope="module")
def built() -> dict[str, dict[str, Any]]:
    return dashboards.build_dashboards()


def all_panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboards.iter_panels(model))


def data_panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in all_panels(model) if panel["type"] != "row"]


# -- the committed JSON ----------------------------------------------------------------------


def test_committed_json_is_what_the_code_builds(built):
    committed = {path.name for path in COMMITTED.glob("*.json")}
    assert committed == set(built), "run `shadow dashboards export` and commit dashboards/"
    for name, model in built.items():
        text = (COMMITTED / name).read_text()
        assert text == dashboards.render(model), f"{name} differs: re-export, don't hand-edit"
        assert json.loads(text) == model


def test_export_is_deterministic(tmp_path):
    first = dashboards.export(tmp_path / "a")
    second = dashboards.export(tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second] == sorted(p.name for p in first)
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes() == (COMMITTED / a.name).read_bytes()
        assert a.read_text().endswith("}\n")


def test_the_cli_exports_the_same_files(tmp_path):
    result = CliRunner().invoke(app, ["dashboards", "export", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    for path in COMMITTED.glob("*.json"):
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes()


# -- Grafana's dashboard model ---------------------------------------------------------------


def conforms(value: Any, hint: Any) -> bool:
    """Whether a decoded value fits a grafana-foundation-sdk type annotation."""
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(conforms(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(hint)
        return isinstance(value, dict) and all(
            conforms(k, key) and conforms(v, item) for k, v in value.items()
        )
    if hint is type(None):
        return value is None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            hint(value)
        except ValueError:
            return False
        return True
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def check_model(obj: Any, where: str = "dashboard") -> Iterator[str]:
    """Every attribute of an SDK model object against its annotation, recursively."""
    if isinstance(obj, list):
        for index, item in enumerate(obj):
            yield from check_model(item, f"{where}[{index}]")
        return
    if not type(obj).__module__.startswith("grafana_foundation_sdk.models"):
        return
    hints = typing.get_type_hints(type(obj))
    for name, hint in hints.items():
        value = getattr(obj, name)
        if not conforms(value, hint):
            yield f"{where}.{name} = {value!r} is not {hint}"
        yield from check_model(value, f"{where}.{name}")


def test_every_dashboard_is_a_valid_grafana_dashboard_model(built):
    register_default_plugins()
    for name, model in built.items():
        decoded = dashboard_model.Dashboard.from_json(model)
        # nothing dropped or added: every key is one the SDK's model knows
        assert json.loads(json.dumps(decoded, cls=JSONEncoder)) == model, name
        problems = list(check_model(decoded))
        assert not problems, f"{name}: " + "; ".join(problems)
        for panel in decoded.panels or []:
            if isinstance(panel, dashboard_model.RowPanel):
                continue
            assert not isinstance(panel.options, dict), f"{name}: unknown panel {panel.type_val}"
            for target in panel.targets or []:
                assert isinstance(target, prometheus_model.Dataquery), (name, panel.title)
                assert not isinstance(target, cogruntime.UnknownDataquery)


def test_required_dashboard_fields(built):
    assert {model["uid"] for model in built.values()} == UIDS
    assert set(built) == {f"{uid}.json" for uid in UIDS}
    titles = {model["title"] for model in built.values()}
    assert titles == {"Shadow: fleet overview", "Shadow: per-worker", "Shadow: decisions",
                      "Shadow: integrity"}  # fmt: skip
    for name, model in built.items():
        assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
        assert model["tags"] == ["balanceroute-shadow"]
        assert model["panels"]
        ids = [panel["id"] for panel in all_panels(model)]
        assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
        for panel in all_panels(model):
            grid = panel["gridPos"]
            assert {"h", "w", "x", "y"} <= set(grid), (name, panel["title"])
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
            assert panel["title"] and panel["type"]
        for panel in data_panels(model):
            assert panel["targets"], (name, panel["title"])
            ref_ids = [target["refId"] for target in panel["targets"]]
            assert len(set(ref_ids)) == len(ref_ids) and all(ref_ids), (name, panel["title"])
        variables = {variable["name"]: variable for variable in model["templating"]["list"]}
        assert set(variables) == VARIABLES
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert variables["fleet"]["query"] == "label_values(shadow_mirror_kv_tokens, fleet)"
        assert variables["policy"]["query"] == (
            'label_values(shadow_window_imbalance_tokens{fleet="$fleet"}, policy)'
        )
        assert variables["worker"]["query"] == (
            'label_values(shadow_mirror_kv_tokens{fleet="$fleet"}, worker)'
        )
        for multi in ("policy", "worker"):
            assert variables[multi]["multi"] and variables[multi]["includeAll"]
        assert not variables["fleet"]["multi"]


def test_no_two_panels_overlap(built):
    for name, model in built.items():
        cells: dict[tuple[int, int], str] = {}
        for panel in all_panels(model):
            grid = panel["gridPos"]
            for x in range(grid["x"], grid["x"] + grid["w"]):
                for y in range(grid["y"], grid["y"] + grid["h"]):
                    assert (x, y) not in cells, f"{name}: {panel['title']} on {cells[(x, y)]}"
                    cells[(x, y)] = panel["title"]


def test_every_panel_reads_the_datasource_variable(built):
    for name, model in built.items():
        for panel in all_panels(model):
            assert panel["datasource"] == DATASOURCE, (name, panel["title"])
            for target in panel.get("targets", []):
                assert target["datasource"] == DATASOURCE, (name, panel["title"])
        for variable in model["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["datasource"] == DATASOURCE


def test_every_panel_has_a_unit_and_a_legend(built):
    for name, model in built.items():
        for panel in data_panels(model):
            where = (name, panel["title"])
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            for target in panel["targets"]:
                assert target.get("legendFormat"), where
            if panel["type"] in ("timeseries", "state-timeline"):
                assert panel["options"]["legend"]["showLegend"] is True, where
            if panel["type"] == "heatmap":
                assert panel["options"]["legend"]["show"] is True, where


# -- the queries -----------------------------------------------------------------------------


def strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: bare identifiers that are not functions,
    keywords, label names (in braces or by/without lists) or range durations."""
    text = strip_strings(expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group()
        if text[match.end() :].lstrip().startswith("("):
            assert word in FUNCTIONS, f"unexpected function {word} in {expr}"
        elif word not in KEYWORDS:
            names.add(word)
    return names


def balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in strip_strings(expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack and expr.count('"') % 2 == 0


def test_the_metric_name_parser():
    expr = (
        "histogram_quantile(0.9, sum by (le, policy) (rate(shadow_route_decision_seconds_bucket"
        '{policy=~"$policy", x="a{b"}[$__rate_interval]))) / on (fleet) shadow_mode or vector(0)'
    )
    assert metric_names(expr) == {"shadow_route_decision_seconds_bucket", "shadow_mode"}
    assert balanced(expr)
    assert not balanced("sum(rate(x[5m])")
    assert not balanced('x{a="b"]')


def test_queries_use_only_exported_metrics(built):
    source = (REPO / "shadow" / "service" / "metrics.py").read_text()
    for name in METRICS:  # the list above is the one metrics.py declares
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert f'"{base}"' in source, f"{base} is not declared in metrics.py"
    used: set[str] = set()
    for name, model in built.items():
        expressions = dashboards.promql_expressions(model)
        assert expressions, name
        for expr in expressions:
            found = metric_names(expr)
            assert found, f"{name}: no metric in {expr}"
            assert found <= METRICS, f"{name}: {found - METRICS} in {expr}"
            assert balanced(expr), f"{name}: unbalanced {expr}"
            used |= found
        for variable in model["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"])
                assert match, variable["query"]
                assert metric_names(match[1]) <= METRICS and balanced(match[1])
    assert len(used) >= 25, sorted(METRICS - used)


def test_every_variable_a_query_uses_is_declared(built):
    for name, model in built.items():
        declared = {variable["name"] for variable in model["templating"]["list"]}
        texts = dashboards.promql_expressions(model) + [
            variable["query"] for variable in model["templating"]["list"]
        ]
        for text in texts:
            for variable in re.findall(r"\$\{?(\w+)", text):
                assert variable in declared | BUILTINS, f"{name}: ${variable} in {text}"


def test_promql_expressions_lists_every_target(built):
    overview = built["shadow-overview.json"]
    expected = [t["expr"] for p in data_panels(overview) for t in p["targets"]]
    assert dashboards.promql_expressions(overview) == expected
    nested = {"panels": [{"type": "row", "panels": [{"targets": [{"expr": "shadow_mode"}]}]}]}
    assert dashboards.promql_expressions(nested) == ["shadow_mode"]


# -- provisioning against a recording imitation of Grafana -----------------------------------


class FakeGrafana:
    """The Grafana HTTP endpoints grafana-client calls for provisioning, in memory, on a
    loopback port, recording every call. Only a Bearer `TOKEN` is accepted."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.folders: dict[str, dict[str, Any]] = {}
        self.datasources: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.port = 0
        self._http: ThreadedServer | None = None

    async def _record(self, request: Request) -> JSONResponse | None:
        body = await request.body()
        self.calls.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": dict(request.query_params),
                "json": json.loads(body) if body else None,
            }
        )
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"message": "Invalid API key", "traceID": ""}, status_code=401)
        return None

    async def search(self, request: Request) -> JSONResponse:
        if denied := await self._record(request):
            return denied
        query = request.query_params.get("query", "").lower()
        kind = request.query_params.get("type")
        hits = [
            {"uid": f["uid"], "title": f["title"], "type": "dash-folder", "id": f["id"]}
            for f in self.folders.values()
            if kind in (None, "dash-folder") and query in f["title"].lower()
        ]
        return JSONResponse(hits)

    async def create_folder(self, request: Request) -> JSONResponse:
        if denied := await self._record(request):
            return denied
        body = await request.json()
        uid = body.get("uid") or f"auto{len(self.folders)}"
        if uid in self.folders or any(f["title"] == body["title"] for f in self.folders.values()):
            return JSONResponse({"message": "a folder with the same name already exists"}, 409)
        self.folders[uid] = {"id": len(self.folders) + 1, "uid": uid, "title": body["title"],
                             "url": f"/dashboards/f/{uid}/", "version": 1}  # fmt: skip
        return JSONResponse(self.folders[uid])

    async def datasource_by_name(self, request: Request) -> JSONResponse:
        if denied := await self._record(request):
            return denied
        name = request.path_params["name"]
        for source in self.datasources.values():
            if source["name"] == name:
                return JSONResponse(source)
        return JSONResponse({"message": "Data source not found"}, status_code=404)

    async def create_datasource(self, request: Request) -> JSONResponse:
        if denied := await self._record(request):
            return denied
        body = await request.json()
        uid = body.get("uid") or f"ds{len(self.datasources)}"
        source = body | {"id": len(self.datasources) + 1, "uid": uid, "version": 1}
        self.datasources[uid] = source
        return JSONResponse({"datasource": source, "id": source["id"], "name": source["name"],
                             "message": "Datasource added"})  # fmt: skip

    async def update_datasource(self, request: Request) -> JSONResponse:
        if denied := await self._record(request):
            return denied
        uid = request.path_params["uid"]
        if uid not in self.datasources:
            return JSONResponse({"message": "Data source not found"}, status_code=404)
        body = await request.json()
        source = self.datasources[uid] | body
        source["version"] = self.datasources[uid]["version"] + 1
        self.datasources[uid] = source
        return JSONResponse({"datasource": source, "message": "Datasource updated"})

    async def save_dashboard(self, request: Request) -> JSONResponse:
        if denied := await self._record(request):
            return denied
        body = await request.json()
        model, folder = body["dashboard"], body.get("folderUid")
        if folder not in self.folders:
            return JSONResponse({"message": "folder not found"}, status_code=400)
        previous = self.dashboards.get(model["uid"])
        if previous is not None and not body.get("overwrite"):
            return JSONResponse({"message": "The dashboard has been changed"}, 412)
        version = 1 if previous is None else previous["version"] + 1
        self.dashboards[model["uid"]] = {"model": model, "folderUid": folder, "version": version}
        return JSONResponse({"id": len(self.dashboards), "uid": model["uid"], "status": "success",
                             "url": f"/d/{model['uid']}/x", "version": version,
                             "slug": "x"})  # fmt: skip

    def start(self) -> FakeGrafana:
        routes = [
            Route("/api/search", self.search, methods=["GET"]),
            Route("/api/folders", self.create_folder, methods=["POST"]),
            Route("/api/datasources/name/{name}", self.datasource_by_name, methods=["GET"]),
            Route("/api/datasources", self.create_datasource, methods=["POST"]),
            Route("/api/datasources/uid/{uid}", self.update_datasource, methods=["PUT"]),
            Route("/api/dashboards/db", self.save_dashboard, methods=["POST"]),
        ]
        self._http = ThreadedServer(Starlette(routes=routes)).start()
        self.port = self._http.port
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self) -> list[tuple[str, str]]:
        """The calls since the last take, as (method, path)."""
        calls, self.calls = self.calls, []
        return [(call["method"], call["path"]) for call in calls]


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana().start()
    yield fake
    fake.stop()


def test_provisioning_creates_then_reuses_and_overwrites(grafana, built):
    prometheus_url = "http://prometheus:9090"
    first = dashboards.provision(grafana.url, TOKEN, datasource_url=prometheus_url)
    assert first["folder"] == {"uid": "balanceroute-shadow", "title": "balanceroute-shadow",
                               "action": "created"}  # fmt: skip
    assert first["datasource"]["action"] == "created"
    assert [d["action"] for d in first["dashboards"]] == ["created"] * 4
    assert {d["uid"] for d in first["dashboards"]} == UIDS
    calls = grafana.calls
    assert [(c["method"], c["path"]) for c in calls] == [
        ("GET", "/api/search"),
        ("POST", "/api/folders"),
        ("GET", "/api/datasources/name/shadow-prometheus"),
        ("POST", "/api/datasources"),
    ] + [("POST", "/api/dashboards/db")] * 4
    assert calls[0]["query"] == {"query": "balanceroute-shadow", "type": "dash-folder"}
    assert calls[1]["json"] == {"title": "balanceroute-shadow", "uid": "balanceroute-shadow"}
    source = calls[3]["json"]
    assert source["name"] == "shadow-prometheus" and source["type"] == "prometheus"
    assert source["url"] == prometheus_url and source["access"] == "proxy"
    for call in calls[4:]:
        body = call["json"]
        assert body["overwrite"] is True and body["folderUid"] == "balanceroute-shadow"
        model = body["dashboard"]
        expected = built[f"{model['uid']}.json"]
        variable = model["templating"]["list"][0]
        assert variable["name"] == "datasource"
        assert variable.pop("current") == {"selected": True, "text": "shadow-prometheus",
                                           "value": "shadow-prometheus"}  # fmt: skip
        assert model == expected  # otherwise the committed model, unchanged
    grafana.take()

    second = dashboards.provision(grafana.url, TOKEN, datasource_url=prometheus_url)
    assert second["folder"]["action"] == "reused"
    assert second["datasource"]["action"] == "unchanged"
    assert [d["action"] for d in second["dashboards"]] == ["updated"] * 4
    assert [d["version"] for d in second["dashboards"]] == [2] * 4
    assert (
        grafana.take()
        == [
            ("GET", "/api/search"),
            ("GET", "/api/datasources/name/shadow-prometheus"),
        ]
        + [("POST", "/api/dashboards/db")] * 4
    )
    assert len(grafana.folders) == 1 and len(grafana.datasources) == 1
    assert len(grafana.dashboards) == 4

    moved = dashboards.provision(grafana.url, TOKEN, datasource_url="http://prom2:9090")
    assert moved["datasource"]["action"] == "updated"
    assert ("PUT", "/api/datasources/uid/shadow-prometheus") in grafana.take()
    assert grafana.datasources["shadow-prometheus"]["url"] == "http://prom2:9090"


def test_provisioning_reuses_a_folder_made_by_hand_and_skips_the_datasource(grafana, built):
    grafana.folders["hand"] = {"id": 1, "uid": "hand", "title": "Shadow boards", "version": 1}
    summary = dashboards.provision(grafana.url, TOKEN, folder="Shadow boards")
    assert summary["folder"] == {"uid": "hand", "title": "Shadow boards", "action": "reused"}
    assert summary["datasource"] is None
    assert not any("datasources" in path for _, path in grafana.take())
    assert {d["folderUid"] for d in grafana.dashboards.values()} == {"hand"}
    for uid, stored in grafana.dashboards.items():
        assert stored["model"] == built[f"{uid}.json"]  # no datasource preselected


def test_a_rejected_token_is_a_clear_error(grafana):
    with pytest.raises(dashboards.ProvisionError, match="401") as error:
        dashboards.provision(grafana.url, "wrong", datasource_url="http://p:9090")
    assert "token" in str(error.value)
    assert grafana.take() == [("GET", "/api/search")]  # stopped at the first refusal
    assert not grafana.folders and not grafana.dashboards


def test_a_refused_connection_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    with pytest.raises(dashboards.ProvisionError, match="cannot connect to Grafana"):
        dashboards.provision(f"http://127.0.0.1:{port}", TOKEN)


def test_a_path_prefix_reaches_grafanas_api():
    api = provisioning._grafana_api("https://example.org/grafana", TOKEN)
    assert api.client.url == "https://example.org/grafana/api"
    assert provisioning._grafana_api("http://g:3000/", TOKEN).client.url == "http://g:3000/api"


def test_the_cli_provisions_and_reports_errors(grafana):
    runner = CliRunner()
    args = ["dashboards", "provision", "--url", grafana.url, "--token", TOKEN]
    result = runner.invoke(app, [*args, "--datasource-url", "http://p:9090"])
    assert result.exit_code == 0, result.output
    assert "created" in result.output and "shadow-overview" in result.output
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "reused" in again.output and "version 2" in again.output
    denied = runner.invoke(app, ["dashboards", "provision", "--url", grafana.url,
                                 "--token", "nope"])  # fmt: skip
    assert denied.exit_code == 1
    assert "401" in denied.output and "token" in denied.output
    grafana.stop()
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1
    assert "cannot connect" in refused.output
