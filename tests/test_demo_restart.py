"""`shadow serve` (the demo) run twice on the same database: the second run continues
the first, with no false violations and new windows, as a newcomer rerunning the
README's first command would expect."""

from __future__ import annotations

import httpx

from tests.service_helpers import Server, write_config
from tests.test_e2e import wait_until


def _windows(url: str) -> int:
    return httpx.get(f"{url}/v1/fleets/default/windows", params={"limit": 1000}).json()["total"]


def _critical(url: str) -> int:
    return httpx.get(f"{url}/v1/fleets").json()[0]["critical_violations"]


def test_a_restarted_demo_continues_on_the_same_database(tmp_path):
    db = tmp_path / "shadow.duckdb"
    config = write_config(tmp_path / "s.toml", window_s=2.0, window_max_lag_s=1.0)
    first = Server(db, config, demo=True).start()
    try:
        wait_until(lambda: _windows(first.url) >= 2, timeout=60)
        before = _critical(first.url)
    finally:
        first.stop()
    second = Server(db, config, demo=True).start()
    try:
        windows = _windows(second.url)
        wait_until(lambda: _windows(second.url) >= windows + 2, timeout=60)
        decisions = httpx.get(f"{second.url}/v1/fleets/default/decisions",
                              params={"limit": 1, "snapshot": "false"}).json()  # fmt: skip
        assert decisions["items"][0]["request_id"].startswith("demo")
        assert _critical(second.url) == before == 0
    finally:
        second.stop()
