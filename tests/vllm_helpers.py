"""What the real-vLLM tests share: finding vLLM, and reading a Prometheus page.

A test that needs vLLM calls `need_vllm()`: it skips where no interpreter with vLLM is
configured (a developer's machine without the extra) and FAILS when
`SHADOW_REQUIRE_VLLM=1`, so a run that promises real vLLM cannot pass by skipping it."""

from __future__ import annotations

import os
import re

import httpx
import pytest

from shadow.world.real_vllm import vllm_python


def need_vllm() -> str:
    python = vllm_python()
    if python is None:
        message = "no vLLM importable: set SHADOW_VLLM_PYTHON to vLLM's interpreter"
        if os.environ.get("SHADOW_REQUIRE_VLLM") == "1":
            pytest.fail(f"SHADOW_REQUIRE_VLLM=1 and {message}")
        pytest.skip(message)
    return python


def scrape(url: str) -> dict[str, float]:
    """`name{labels}` -> value of a Prometheus text page."""
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def engine_value(page: dict[str, float], name: str, engine: int | str) -> float:
    pattern = re.compile(rf'^{re.escape(name)}\{{.*engine="{engine}".*\}}$')
    found = [v for k, v in page.items() if pattern.match(k)]
    assert len(found) == 1, (name, engine, found)
    return found[0]
