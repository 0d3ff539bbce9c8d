"""Fixtures shared by the browser tests (`tests/test_ui*.py`): each module defines its own
`server` (a `ServerProcess`); these give it an API client and a headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest


@pytest.fixture(scope="module")
def api(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def browser(server):
    from playwright import sync_api

    from shadow.bench.ui import launch_chromium

    with sync_api.sync_playwright() as p:
        browser = launch_chromium(p)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def gate_evidence(tmp_path_factory):
    """A database of recorded evidence for the gate (a JSQ replay of `paper-azure2024` at
    load 0.8, ingested): brh-survival PASSes on it, random FAILs. Tests copy it."""
    from typer.testing import CliRunner

    from shadow.cli import app
    from tests.service_helpers import record

    root = tmp_path_factory.mktemp("gate-evidence")
    log = root / "jsq.jsonl"
    record(log, 10_000, load=0.8)
    db = root / "shadow.duckdb"
    result = CliRunner().invoke(app, ["ingest", str(log), "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db
