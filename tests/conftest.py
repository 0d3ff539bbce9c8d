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
