"""The web UI in a real headless Chromium against a real `shadow serve --demo` (docs/UI.md).

One server and one browser for the module: two tiny stored replays, the demo fleet's live
traffic, windows every 3 s and one gate dry run. Every page must load without console
errors or failed requests, draw its charts with data, keep its state in the URL, and
render hostile strings from the API as text. Screenshots go to `test-artifacts/`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright import sync_api

from shadow.bench.ui import PAGES as BENCH_PAGES
from shadow.bench.ui import find_chromium
from shadow.world.process import ServerProcess

expect = sync_api.expect

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
FLEET = "default"
CHROMIUM = find_chromium()
PAGES = {**BENCH_PAGES, "replays": "/replays?runs=1,2"}  # the two replays the fixture stores
XSS_ID = '<img src=x onerror="window.__xss=1">'
XSS_WORKER = "<svg onload=window.__xss2=1>"
XSS_GHOST = "<img src=y onerror=window.__xss3=1>"  # dispatched never ready: a violation

STATIC = REPO / "shadow" / "ui" / "static"


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    if CHROMIUM is None:
        pytest.fail("the UI tests need Debian's Chromium: apt-get install chromium (.ci/run does)")
    tmp = tmp_path_factory.mktemp("ui")
    db = tmp / "ui.duckdb"
    for limit in (80, 40):  # two stored runs that differ (the replays page sorts them)
        subprocess.run(
            [sys.executable, "-m", "shadow.cli", "replay", "synthetic:small", "--db", str(db),
             "--workers", "4", "--batch", "16", "--limit", str(limit), "--policies",
             "jsq,br0,brh-survival"],
            cwd=REPO, check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    config = tmp / "ui.toml"
    # Short windows, evaluated 1 s after they close (not when their last request ends).
    config.write_text(
        "window_s = 3.0\nwindow_max_lag_s = 1.0\n"
        'window_policies = ["jsq-pool", "br0", "brh-survival"]\n'
    )
    proc = ServerProcess(db, config, demo=True).start()
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as client:

            def evidence():
                fleets = {f["fleet"]: f for f in client.get("/v1/fleets").json()}
                if fleets.get(FLEET, {}).get("windows", 0) < 3:
                    return False
                page = client.get(
                    f"/v1/fleets/{FLEET}/decisions",
                    params={"limit": 1, "disagreements_only": "true", "snapshot": "false"},
                ).json()
                return page["total"] > 0

            wait_until(evidence, 90, ">= 3 evaluated windows and audited disagreements")
            body = {"candidate": "br0", "baseline": "jsq-pool"}
            response = client.post(f"/v1/fleets/{FLEET}/gate/dry-run", json=body)
            assert response.status_code == 200, response.text
        yield proc
    finally:
        proc.stop()


class Watched:
    """A page with everything that went wrong recorded: console errors, uncaught
    exceptions, failed requests and HTTP errors."""

    def __init__(self, page, base: str) -> None:
        self.page = page
        self.base = base
        self.problems: list[str] = []
        self.posts: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"pageerror: {error}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        page.on("request", lambda r: self.posts.append(r.url) if r.method != "GET" else None)

    def _console(self, message) -> None:
        if message.type == "error":
            self.problems.append(f"console: {message.text}")

    def _failed(self, request) -> None:
        # A fetch cut short by leaving the page is not a failure of the UI.
        if "ERR_ABORTED" not in (request.failure or ""):
            self.problems.append(f"request failed: {request.url} {request.failure}")

    def _response(self, response) -> None:
        if response.status >= 400:
            self.problems.append(f"HTTP {response.status}: {response.url}")

    def goto(self, path: str, ready: str) -> None:
        self.page.goto(self.base + path)
        self.ready(ready)

    def ready(self, name: str, timeout: float = 20_000) -> None:
        """Wait until page `name` has drawn its data for the URL now in the address bar."""
        url = urlsplit(self.page.url)
        state = url.path + (f"?{url.query}" if url.query else "")
        state = state.replace("\\", "\\\\").replace('"', '\\"')
        self.page.wait_for_selector(
            f'body[data-ready="{name}"][data-state="{state}"]', state="attached", timeout=timeout
        )

    def assert_clean(self) -> None:
        assert self.problems == [], "\n".join(self.problems)
        banner = self.page.locator("#banner")
        assert banner.is_hidden(), banner.inner_text()

    def charts(self) -> list[tuple[int, int]]:
        return [
            (int(el.get_attribute("data-series")), int(el.get_attribute("data-points")))
            for el in self.page.locator(".chart[data-series]").all()
        ]

    def column(self, table: str, key: str) -> list[str]:
        return self.page.locator(
            f'[data-table="{table}"] tbody td[data-col="{key}"]'
        ).all_inner_texts()


@pytest.fixture(scope="module")
def context(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    yield context
    context.close()


@pytest.fixture
def ui(context, server) -> Iterator[Watched]:
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield Watched(page, server.url)
    page.close()


def number(text: str) -> float:
    return float(text.replace(",", "").replace("–", "nan"))


def post_events(api: httpx.Client, events: list[dict]) -> None:
    response = api.post(
        "/v1/events",
        content="\n".join(json.dumps(e) for e in events),
        headers={"content-type": "application/x-ndjson"},
    )
    assert response.status_code == 200 and response.json()["accepted"] == len(events), response.text


def workers(api: httpx.Client, fleet: str = FLEET) -> list[str]:
    return [w["worker"] for w in api.get(f"/v1/fleets/{fleet}/snapshot").json()["workers"]]


# ---- the code itself ----------------------------------------------------------------------


def test_ui_code_builds_dom_only_through_text_and_checked_attributes():
    """No HTML parsing of strings, no eval, nothing inline (the CSP would refuse it)."""
    scripts = [p for p in STATIC.rglob("*.js") if "vendor" not in p.parts]
    assert len(scripts) >= 8
    banned = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function"
    )
    for path in scripts:
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")
        )
        assert not banned.search(code), f"{path.name}: {banned.search(code).group(0)}"
    index = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", index), "inline <script> in index.html"
    assert "<style" not in index and " style=" not in index
    assert re.search(r'<script type="module" src="/static/app.js">', index)


def test_dom_helper_refuses_handlers_and_foreign_links(ui):
    ui.goto(f"/replays?fleet={FLEET}", "replays")
    result = ui.page.evaluate(
        """async () => {
          const { h } = await import("/static/lib/dom.js");
          const out = [];
          for (const attrs of [{ onclick: "alert(1)" }, { href: "javascript:alert(1)" },
                               { href: "//evil.example/" }, { srcdoc: "<b>" }]) {
            try { h("a", attrs); out.push("accepted"); } catch { out.push("refused"); }
          }
          const el = h("div", { title: '"><b>' }, "<b>x</b>", 42);
          out.push(el.children.length, el.textContent, el.title);
          return out;
        }"""
    )
    assert result == ["refused"] * 4 + [0, "<b>x</b>42", '"><b>']


# ---- every page -------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PAGES))
def test_page_loads_clean_and_is_screenshotted(ui, name):
    ui.goto(f"{PAGES[name]}{'&' if '?' in PAGES[name] else '?'}fleet={FLEET}", name)
    ui.page.wait_for_timeout(300)  # let late console errors surface
    ui.assert_clean()
    assert ui.page.locator(f'#nav a[data-page="{name}"]').get_attribute("aria-current") == "page"
    for series, points in ui.charts():
        assert series > 0 and points > 0
    if name in ("overview", "compare", "integrity", "replays"):
        assert ui.charts(), f"{name} drew no chart"
    assert ui.posts == [], f"the {name} page wrote without being asked: {ui.posts}"
    ARTIFACTS.mkdir(exist_ok=True)
    ui.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_overview_shows_ratios_and_live_bars_per_worker(ui, api):
    ui.goto(f"/?fleet={FLEET}", "overview")
    section = ui.page.locator(f'section.fleet[data-fleet="{FLEET}"]')
    for policy in ("br0", "brh-survival"):
        card = section.locator(f'.headline[data-policy="{policy}"]')
        expect(card).to_be_visible()
        assert re.fullmatch(r"\d\.\d{3}", card.locator(".hm-value").first.inner_text())
    bars = section.locator(".live-bars .wbar")
    assert sorted(bars.evaluate_all("els => els.map(e => e.dataset.worker)")) == sorted(
        workers(api)
    )
    ui.assert_clean()


def test_compare_has_one_series_per_worker_per_policy_on_one_scale(ui, api):
    # A window where every policy took steps. In a window without arrivals, a
    # counterfactual that had drained its requests takes none, and its chart is rightly
    # empty: CI drew such a latest window once (0 requests; observed 45 points, each
    # counterfactual 0) on a host too loaded for the demo's traffic to keep up.
    windows = api.get(f"/v1/fleets/{FLEET}/windows", params={"limit": 20}).json()["items"]
    for window in windows:
        index = window["window_index"]
        data = api.get(f"/v1/fleets/{FLEET}/compare", params={"window": index}).json()
        if all(series["t"] for series in data["series"].values()):
            break
    else:
        pytest.fail(f"no window of {len(windows)} has steps for every policy")
    ui.goto(f"/compare?fleet={FLEET}&window={index}", "compare")
    g = len(workers(api))
    policies = list(data["series"])
    assert len(policies) >= 3 and "observed" in policies
    charts = ui.page.locator('[data-chart="trajectory"]')
    assert charts.count() == len(policies)
    for i, policy in enumerate(policies):
        chart = charts.nth(i)
        assert chart.get_attribute("data-policy") == policy
        assert int(chart.get_attribute("data-series")) == g
        # the page draws every point the API holds for the window
        assert int(chart.get_attribute("data-points")) == len(data["series"][policy]["t"])
    for key in ("imbalance", "gap", "step_ms"):
        assert int(ui.page.locator(f'[data-chart="{key}"]').get_attribute("data-series")) == len(
            policies
        )
    # Same y scale: every small multiple labels the same y ticks.
    ticks = [charts.nth(i).locator(".u-axis").nth(1).inner_text() for i in range(len(policies))]
    assert len(set(ticks)) == 1, ticks
    rows = ui.page.locator('[data-table="summary"] tbody tr')
    assert rows.count() == len(data["summary"]["rows"])
    ui.assert_clean()


def test_compare_window_is_in_the_url(ui, api):
    first = api.get(f"/v1/fleets/{FLEET}/windows", params={"limit": 1}).json()["items"][0]
    index = first["window_index"]
    ui.goto(f"/compare?fleet={FLEET}&window={index}", "compare")
    assert ui.page.locator("select.window-select").input_value() == str(index)
    expect(ui.page.locator(".range-line")).to_contain_text(f"Window #{index}")
    ui.page.locator("button", has_text="Latest").click()
    expect(ui.page).not_to_have_url(re.compile(r"window="))
    ui.ready("compare")
    ui.page.go_back()
    expect(ui.page).to_have_url(re.compile(rf"window={index}\b"))
    ui.ready("compare")
    assert ui.page.locator("select.window-select").input_value() == str(index)
    # Hiding a worker in the shared legend is view state too (and needs no refetch).
    ui.page.locator(".legend-item").first.click()
    expect(ui.page).to_have_url(re.compile(r"hide=0\b"))
    ui.ready("compare")
    ui.page.reload()
    ui.ready("compare")
    expect(ui.page.locator(".legend-item").first).to_have_class(re.compile(r"\boff\b"))
    assert ui.page.locator(".legend-item.off").count() == 1
    ui.assert_clean()


# ---- decisions ---------------------------------------------------------------------------


def test_decision_filters_change_the_rows_the_total_and_the_url(ui):
    ui.goto(f"/decisions?fleet={FLEET}", "decisions")
    total = int(ui.page.locator(".list-count").get_attribute("data-total"))
    ui.page.get_by_label("Disagreements only").check()
    expect(ui.page).to_have_url(re.compile(r"disagreements_only=true"))
    ui.ready("decisions")
    filtered = int(ui.page.locator(".list-count").get_attribute("data-total"))
    assert 0 < filtered < total
    agrees = ui.column("decisions", "agrees")
    assert agrees and set(agrees) == {"differs"}
    ui.page.locator('select[name="policy"]').select_option("br0")
    expect(ui.page).to_have_url(re.compile(r"policy=br0"))
    ui.ready("decisions")
    policies = ui.page.locator('[data-table="decisions"] tbody tr').evaluate_all(
        "rows => rows.map(r => r.dataset.policy)"
    )
    assert policies and set(policies) == {"br0"}
    by_policy = int(ui.page.locator(".list-count").get_attribute("data-total"))
    assert by_policy <= filtered
    regret = ui.page.locator('input[name="min_regret"]')
    regret.fill("1")
    regret.press("Enter")
    expect(ui.page).to_have_url(re.compile(r"min_regret=1\b"))
    ui.ready("decisions")
    assert all(number(t) >= 1 for t in ui.column("decisions", "regret"))
    assert int(ui.page.locator(".list-count").get_attribute("data-total")) <= by_policy
    ui.page.locator('select[name="worker"]').select_option("0")
    expect(ui.page).to_have_url(re.compile(r"worker=0\b"))
    ui.ready("decisions")
    pairs = zip(
        ui.column("decisions", "incumbent_worker"), ui.column("decisions", "choice"), strict=True
    )
    assert all("0" in pair for pair in pairs)
    ui.assert_clean()


def test_decision_sort_is_server_side_by_column_header(ui):
    ui.goto(f"/decisions?fleet={FLEET}", "decisions")
    header = ui.page.locator('[data-table="decisions"] th[data-key="prompt_tokens"] button')
    header.click()
    expect(ui.page).to_have_url(re.compile(r"sort=prompt_tokens&order=desc"))
    ui.ready("decisions")
    down = [number(t) for t in ui.column("decisions", "prompt_tokens")]
    assert down == sorted(down, reverse=True) and down[0] > down[-1]
    header.click()
    expect(ui.page).to_have_url(re.compile(r"order=asc"))
    ui.ready("decisions")
    up = [number(t) for t in ui.column("decisions", "prompt_tokens")]
    assert up == sorted(up) and up != down
    sorted_header = ui.page.locator('[data-table="decisions"] th[data-key="prompt_tokens"]')
    assert sorted_header.get_attribute("aria-sort") == "ascending"
    ui.assert_clean()


def test_opening_a_decision_shows_one_bar_per_worker(ui, api):
    ui.goto(f"/decisions?fleet={FLEET}&disagreements_only=true", "decisions")
    row = ui.page.locator('[data-table="decisions"] tbody tr').first
    ingest_id = row.get_attribute("data-ingest-id")
    row.click()
    expect(ui.page).to_have_url(re.compile(rf"decision={ingest_id}\b"))
    ui.ready("decisions")
    detail = ui.page.locator(f'.detail[data-ingest-id="{ingest_id}"]')
    expect(detail).to_be_visible()
    bars = detail.locator('[data-bars="decision"] .wbar')
    names = bars.evaluate_all("els => els.map(e => e.dataset.worker)")
    assert names == workers(api)
    body = api.get(f"/v1/fleets/{FLEET}/decisions/{ingest_id}").json()
    assert detail.locator("h2").inner_text() == body["request_id"]
    chips = detail.locator(".choice-chip[data-policy]")
    assert chips.count() == len(body["choices"])
    ui.assert_clean()


def test_a_shared_decisions_link_restores_the_view_and_back_works(ui, api):
    page = api.get(
        f"/v1/fleets/{FLEET}/decisions",
        params={"disagreements_only": "true", "policy": "br0", "snapshot": "false", "limit": 1},
    ).json()
    ingest_id = page["items"][0]["ingest_id"]
    link = (
        f"/decisions?fleet={FLEET}&disagreements_only=true&policy=br0&sort=prompt_tokens"
        f"&order=asc&decision={ingest_id}"
    )
    ui.goto(link, "decisions")
    assert ui.page.get_by_label("Disagreements only").is_checked()
    assert ui.page.locator('select[name="policy"]').input_value() == "br0"
    header = ui.page.locator('[data-table="decisions"] th[data-key="prompt_tokens"]')
    assert header.get_attribute("aria-sort") == "ascending"
    expect(ui.page.locator(f'.detail[data-ingest-id="{ingest_id}"]')).to_be_visible()
    prompts = [number(t) for t in ui.column("decisions", "prompt_tokens")]
    assert prompts == sorted(prompts)
    ui.page.locator("button", has_text="Clear filters").click()
    expect(ui.page).not_to_have_url(re.compile(r"disagreements_only"))
    ui.ready("decisions")
    assert not ui.page.get_by_label("Disagreements only").is_checked()
    ui.page.go_back()
    expect(ui.page).to_have_url(re.compile(r"disagreements_only=true"))
    ui.ready("decisions")
    assert ui.page.get_by_label("Disagreements only").is_checked()
    assert ui.page.locator('select[name="policy"]').input_value() == "br0"
    ui.assert_clean()


# ---- integrity, gate, replays -------------------------------------------------------------


def test_integrity_shows_fidelity_per_window_and_the_chain(ui, api):
    ui.goto(f"/integrity?fleet={FLEET}", "integrity")
    windows = api.get(f"/v1/fleets/{FLEET}/windows", params={"limit": 1000}).json()["total"]
    chart = ui.page.locator('[data-chart="fidelity"]')
    assert chart.get_attribute("data-series") == "3"  # imbalance, step, the 1.0 reference
    assert int(chart.get_attribute("data-points")) >= min(windows, 3)
    expect(ui.page.locator(".chain")).to_contain_text("chain intact")
    engines = api.get(f"/v1/fleets/{FLEET}/telemetry").json()["engines"]
    assert ui.page.locator('[data-table="telemetry"] tbody tr').count() == len(engines)
    ui.assert_clean()


def test_gate_report_and_a_dry_run_only_on_click(ui, api):
    runs = api.get(f"/v1/fleets/{FLEET}/gate/runs").json()["items"]
    report = api.get(f"/v1/gate/runs/{runs[0]['id']}").json()
    ui.goto(f"/gate?fleet={FLEET}", "gate")
    assert ui.posts == []
    expect(ui.page.locator(".deciding-rule")).to_have_text(report["deciding_rule"])
    expect(ui.page.locator(".verdict-big")).to_contain_text(report["verdict"])
    assert ui.page.locator('[data-table="metrics"] tbody tr').count() == len(report["rows"])
    ui.page.locator('select[name="candidate"]').select_option("brh-survival")
    ui.page.get_by_role("button", name="Dry run now").click()
    expect(ui.page).to_have_url(re.compile(r"run=\d+"), timeout=30_000)
    ui.ready("gate", timeout=30_000)
    assert len(ui.posts) == 1 and ui.posts[0].endswith(f"/v1/fleets/{FLEET}/gate/dry-run")
    new_id = re.search(r"run=(\d+)", ui.page.url).group(1)
    assert ui.page.locator(".report").get_attribute("data-run") == new_id
    assert int(new_id) not in {r["id"] for r in runs}
    ui.assert_clean()


def test_replays_side_by_side_and_client_side_sort(ui):
    ui.goto(f"/replays?fleet={FLEET}", "replays")
    order = lambda: ui.column("replays", "id")  # noqa: E731
    assert order() == ["2", "1"]  # newest first
    ui.page.locator('[data-table="replays"] th[data-key="requests"] button').click()
    expect(ui.page).to_have_url(re.compile(r"s_replays=-requests"))
    ui.ready("replays")
    assert order() == ["1", "2"]  # run 1 replayed 80 requests, run 2 40
    for run in ("1", "2"):
        ui.page.locator(f'input[type="checkbox"][data-run="{run}"]').check()
        expect(ui.page).to_have_url(re.compile(r"runs="))
        ui.ready("replays")
    assert re.search(r"runs=1(%2C|,)2", ui.page.url)
    charts = ui.page.locator(".chart[data-run]")
    assert charts.count() == 2
    assert ui.page.locator('[data-table="replay-compare"] tbody tr').count() == 6  # 3 x 2
    ui.assert_clean()


# ---- hostile strings are text ------------------------------------------------------------


def test_hostile_ids_and_worker_names_render_as_text(ui, api):
    now = time.time()
    worker = workers(api)[0]
    events = [
        {"type": "ready", "ts": now, "fleet": FLEET, "request_id": XSS_ID, "prompt_tokens": 321},
        {"type": "dispatch", "ts": now + 0.001, "fleet": FLEET, "request_id": XSS_ID,
         "worker": worker, "policy": "jsq"},
        {"type": "worker", "ts": now, "fleet": "xss", "worker": XSS_WORKER, "capacity": 4},
        {"type": "worker", "ts": now, "fleet": "xss", "worker": "w1", "capacity": 4},
        {"type": "ready", "ts": now, "fleet": "xss", "request_id": "x1", "prompt_tokens": 100},
        {"type": "dispatch", "ts": now + 0.001, "fleet": "xss", "request_id": "x1",
         "worker": XSS_WORKER, "policy": "jsq"},
        {"type": "dispatch", "ts": now + 0.002, "fleet": "xss", "request_id": XSS_GHOST,
         "worker": "w1", "policy": "jsq"},
    ]  # fmt: skip
    post_events(api, events)
    window = {"since": f"{now - 1:.3f}", "until": f"{now + 1:.3f}"}

    def audited():
        items = api.get(
            f"/v1/fleets/{FLEET}/decisions", params={**window, "snapshot": "false", "limit": 1000}
        ).json()["items"]
        return next((r["ingest_id"] for r in items if r["request_id"] == XSS_ID), None)

    ingest_id = wait_until(audited, 20, "the hostile dispatch in the decision audit")
    # Let the request leave the demo fleet, so the mirror stays true to the engines.
    post_events(api, [{"type": "finish", "ts": time.time(), "fleet": FLEET,
                       "request_id": XSS_ID, "output_tokens": 1, "reason": "stop"}])  # fmt: skip
    ui.goto(
        f"/decisions?fleet={FLEET}&since={window['since']}&until={window['until']}"
        f"&decision={ingest_id}&limit=1000",  # the demo's own dispatches share the 2 s
        "decisions",
    )
    expect(ui.page.locator(".detail h2")).to_have_text(XSS_ID)
    cells = ui.page.locator('[data-table="decisions"] td[data-col="request_id"]')
    assert XSS_ID in cells.all_inner_texts()
    assert ui.page.locator('[data-table="decisions"] img').count() == 0
    assert ui.page.locator('img[src="x"]').count() == 0
    assert ui.page.evaluate("window.__xss") is None

    def seen(path: str):
        return api.get(path, params={"snapshot": "false"}).json()["total"]

    wait_until(lambda: seen("/v1/fleets/xss/decisions"), 20, "the hostile worker in the audit")
    wait_until(lambda: seen("/v1/fleets/xss/violations"), 20, "the hostile violation")
    ui.goto("/?fleet=xss", "overview")
    bars = ui.page.locator('section.fleet[data-fleet="xss"] .live-bars .wbar')
    expect(bars.first).to_be_visible()
    assert XSS_WORKER in bars.evaluate_all("els => els.map(e => e.dataset.worker)")
    expect(ui.page.get_by_text(XSS_WORKER).first).to_be_visible()
    assert ui.page.locator("svg[onload]").count() == 0
    ui.goto("/decisions?fleet=xss", "decisions")
    assert XSS_WORKER in ui.column("decisions", "incumbent_worker")
    assert XSS_GHOST in ui.column("decisions", "request_id")
    assert (
        ui.page.locator('[data-table="decisions"] img, [data-table="decisions"] svg').count() == 0
    )
    ui.goto("/integrity?fleet=xss", "integrity")
    assert XSS_GHOST in ui.column("violations", "request_id")
    details = " ".join(ui.column("violations", "detail"))
    assert XSS_GHOST in details
    assert ui.page.locator('img[src="y"]').count() == 0
    assert ui.page.evaluate("[window.__xss, window.__xss2, window.__xss3]") == [None] * 3
    ui.assert_clean()


def test_with_read_tokens_the_ui_asks_for_one_and_uses_it(browser, tmp_path):
    """A service with a read token: the page asks once, keeps it for the tab, and draws."""
    token = "ui-read-token-0123456789"
    config = tmp_path / "service.toml"
    config.write_text(f'[[tokens]]\nname = "ui"\ntoken = "{token}"\nroles = ["read"]\n')
    secured = ServerProcess(tmp_path / "shadow.duckdb", config).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(secured.url + "/")
        form = page.locator("#banner .token-form")
        expect(form).to_be_visible()
        form.locator("input").fill(token)
        form.locator("button").click()
        page.wait_for_selector('body[data-ready="overview"]', state="attached", timeout=20_000)
        assert page.evaluate("sessionStorage.getItem('shadow-token')") == token
        assert page.locator("#banner .token-form").count() == 0
    finally:
        context.close()
        secured.stop()
