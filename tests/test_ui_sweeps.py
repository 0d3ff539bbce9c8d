"""The Sweeps page in a real headless Chromium against a real `shadow serve` (docs/UI.md).

One 2 x 2 sweep (beta x gamma, BR-H oracle, a loaded 4-worker fleet so the cells differ)
is stored with the CLI before the server opens the database (DuckDB has one writer). The
page must draw the throughput and TPOT P95 heatmaps with exactly the API's values, outline
the best cell, keep every choice in the URL, and say how to make a sweep when none exists.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from shadow.world.process import ServerProcess
from tests.test_ui import ARTIFACTS, CHROMIUM, REPO, Watched

SWEEP = "ui-grid"
BETAS, GAMMAS = (5.0, 100.0), (0.5, 0.95)


def _serve(db, tmp) -> ServerProcess:
    config = tmp / "service.toml"
    config.write_text("windows = false\n")
    return ServerProcess(db, config).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    if CHROMIUM is None:
        pytest.fail("the UI tests need Debian's Chromium: apt-get install chromium (.ci/run does)")
    tmp = tmp_path_factory.mktemp("ui-sweeps")
    db = tmp / "sweeps.duckdb"
    subprocess.run(
        [sys.executable, "-m", "shadow.cli", "sweep", "synthetic:small", "--name", SWEEP,
         "--param", f"beta={','.join(map(str, BETAS))}",
         "--param", f"gamma={','.join(map(str, GAMMAS))}",
         "--param", "policy=brh-oracle", "--param", "workers=4", "--param", "batch=16",
         "--param", "load=2", "--limit", "80", "--jobs", "1", "--db", str(db)],
        cwd=REPO, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    proc = _serve(db, tmp)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def ui(browser, server) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield Watched(page, server.url)
    context.close()


def heatmap(api: httpx.Client, metric: str, x: str = "beta", y: str = "gamma") -> dict:
    response = api.get(
        f"/v1/sweeps/{SWEEP}/heatmap",
        params={"x": x, "y": y, "metric": metric, "policy": "brh-oracle"},
    )
    assert response.status_code == 200, response.text
    return response.json()


def expected_cells(hm: dict) -> dict[tuple[float, float], float]:
    """{(x, y): value} of the API's non-null cells."""
    return {
        (float(xv), float(yv)): hm["z"][j][i]
        for j, yv in enumerate(hm["y"]["values"])
        for i, xv in enumerate(hm["x"]["values"])
        if hm["z"][j][i] is not None
    }


def drawn(ui: Watched, panel: str) -> dict:
    """What the page drew for heatmap `panel`: its container's attributes and its cells."""
    host = ui.page.locator(f'.heatmap[data-panel="{panel}"]')
    cells = host.locator("rect.hm-cell").evaluate_all(
        """els => els.map(e => ({x: e.dataset.x, y: e.dataset.y, value: e.dataset.value,
            best: e.dataset.best === "true", box: [e.x.baseVal.value, e.y.baseVal.value,
            e.width.baseVal.value, e.height.baseVal.value]}))"""
    )
    outline = host.locator("rect.hm-best").evaluate_all(
        """els => els.map(e => [e.x.baseVal.value, e.y.baseVal.value, e.width.baseVal.value,
            e.height.baseVal.value, getComputedStyle(e).stroke, getComputedStyle(e).strokeWidth])"""
    )
    return {
        "series": host.get_attribute("data-series"),
        "points": host.get_attribute("data-points"),
        "metric": host.get_attribute("data-metric"),
        "cells": cells,
        "values": {(float(c["x"]), float(c["y"])): float(c["value"]) for c in cells},
        "texts": host.locator("text.hm-value").all_text_contents(),
        "outline": outline,
    }


def assert_matches(grid: dict, hm: dict, better: str) -> None:
    want = expected_cells(hm)
    assert grid["series"] == "1" and grid["points"] == str(len(want)) == "4"
    assert grid["metric"] == hm["metric"]
    assert len(grid["cells"]) == 4
    assert grid["values"] == want
    # Each cell prints its value (rounded for display), in the cells' order.
    assert len(grid["texts"]) == 4
    for cell, text in zip(grid["cells"], grid["texts"], strict=True):
        assert float(text.replace(",", "")) == pytest.approx(float(cell["value"]), rel=1e-3)
    # The best cell (highest throughput, lowest TPOT) is marked and outlined.
    pick = max if better == "higher" else min
    best_at = pick(want, key=want.get)
    marked = [c for c in grid["cells"] if c["best"]]
    assert len(marked) == 1
    assert (float(marked[0]["x"]), float(marked[0]["y"])) == best_at
    assert len(grid["outline"]) == 1
    x, y, w, h, stroke, width = grid["outline"][0]
    cx, cy, cw, ch = marked[0]["box"]
    assert abs(x - cx) <= 2 and abs(y - cy) <= 2 and abs(w - cw) <= 3 and abs(h - ch) <= 3
    assert stroke not in ("none", "") and float(width.removesuffix("px")) >= 2


def query(ui: Watched) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(ui.page.url).query).items()}


# ---- tests --------------------------------------------------------------------------------


def test_sweeps_page_draws_both_heatmaps_with_the_api_values(ui, api):
    ui.goto("/sweeps", "sweeps")
    ui.page.wait_for_timeout(300)  # let late console errors surface
    ui.assert_clean()
    assert ui.page.locator('#nav a[data-page="sweeps"]').get_attribute("aria-current") == "page"
    assert ui.column("sweeps", "name") == [SWEEP]
    assert ui.column("sweeps", "cells") == ["4"]
    varied = ui.column("sweeps", "varied")[0]
    assert "beta" in varied and "gamma" in varied
    assert ui.page.locator('select[data-picker="x"]').input_value() == "beta"
    assert ui.page.locator('select[data-picker="y"]').input_value() == "gamma"
    assert ui.page.locator('select[data-picker="policy"]').input_value() == "brh-oracle"
    assert_matches(drawn(ui, "left"), heatmap(api, "throughput_tok_s"), "higher")
    assert_matches(drawn(ui, "right"), heatmap(api, "tpot_p95_ms"), "lower")
    # Axis titles name the parameters; each legend carries its unit.
    titles = ui.page.locator(".heatmap text.hm-axis-title").all_text_contents()
    assert sum("beta" in t for t in titles) == 2 and sum("gamma" in t for t in titles) == 2
    legends = ui.page.locator(".hm-legend").all_inner_texts()
    assert "tok/s" in legends[0] and "ms" in legends[1]
    assert ui.posts == []
    ARTIFACTS.mkdir(exist_ok=True)
    ui.page.screenshot(path=str(ARTIFACTS / "sweeps.png"), full_page=True)


def test_axis_and_metric_pickers_are_in_the_url_and_redraw_the_grid(ui, api):
    ui.goto(f"/sweeps?sweep={SWEEP}", "sweeps")
    # Choosing gamma for x swaps the axes.
    ui.page.select_option('select[data-picker="x"]', "gamma")
    ui.ready("sweeps")
    assert query(ui) == {"sweep": SWEEP, "x": "gamma", "y": "beta"}
    grid = drawn(ui, "left")
    assert {float(c["x"]) for c in grid["cells"]} == set(GAMMAS)
    hm = heatmap(api, "throughput_tok_s", x="gamma", y="beta")
    assert grid["values"] == expected_cells(hm)
    # Another metric in the left panel: in the URL, drawn with the API's values.
    ui.page.select_option('select[data-metric-picker="left"]', "imbalance_mean")
    ui.ready("sweeps")
    assert query(ui)["left"] == "imbalance_mean"
    assert_matches(drawn(ui, "left"), heatmap(api, "imbalance_mean", "gamma", "beta"), "lower")
    assert drawn(ui, "right")["metric"] == "tpot_p95_ms"
    # The link restores the view; back returns to the previous one.
    shared = ui.page.url
    ui.page.goto(shared)
    ui.ready("sweeps")
    assert drawn(ui, "left")["metric"] == "imbalance_mean"
    assert ui.page.locator('select[data-picker="x"]').input_value() == "gamma"
    ui.page.go_back()
    ui.ready("sweeps")
    assert "left" not in query(ui)
    assert drawn(ui, "left")["metric"] == "throughput_tok_s"
    ui.assert_clean()


def test_without_sweeps_the_page_says_how_to_store_one(browser, tmp_path):
    proc = _serve(tmp_path / "empty.duckdb", tmp_path)
    context = browser.new_context()
    try:
        ui = Watched(context.new_page(), proc.url)
        ui.goto("/sweeps", "sweeps")
        hint = ui.page.locator(".sweep-maps .empty").inner_text()
        assert "shadow sweep synthetic:small --param beta=20,43 --param gamma=0.8,0.9" in hint
        assert "--db" in hint and "one writer" in hint
        assert ui.page.locator(".heatmap").count() == 0
        ui.assert_clean()
    finally:
        context.close()
        proc.stop()
