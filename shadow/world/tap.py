"""The emulated world's tap: the deployable tap (`shadow.connectors.tap`) on one shared
listener, engine `g` behind the path prefix `/g`, as the world's router calls it
(`POST {tap}/{worker}/v1/completions`).

The router announces `ready` under its own `X-Request-Id`, so this tap names requests by
that header (`request_ids = "header"`) and does not announce `ready` again.
"""

from __future__ import annotations

from shadow.connectors.tap.config import EngineConfig, TapConfig
from shadow.connectors.tap.listener import Listener, listen
from shadow.connectors.tap.proxy import (
    GENERATION_PATHS,
    HOP_BY_HOP,
    TapProxy,
    prompt_hash_of,
    prompt_tokens_of,
    proxy_client,
)


def world_tap_config(
    workers: dict[str, str],
    *,
    capacity: int,
    policy: str = "jsq-pool",
    progress_interval_s: float = 0.1,
    fleet: str = "default",
) -> TapConfig:
    """The tap config of the world: every worker by path prefix on one listener (its
    address is the world's to choose: it serves `TapProxy.handler()` itself, `listen`)."""
    engines = tuple(
        EngineConfig(worker=worker, upstream=url, path_prefix=f"/{worker}", capacity=capacity)
        for worker, url in workers.items()
    )
    return TapConfig(
        fleet=fleet, listen=("127.0.0.1", 0), progress_interval_s=progress_interval_s,
        request_ids="header", policy=policy, emit_ready=False, engines=engines,
    )  # fmt: skip


__all__ = [
    "GENERATION_PATHS",
    "HOP_BY_HOP",
    "Listener",
    "TapProxy",
    "listen",
    "prompt_hash_of",
    "prompt_tokens_of",
    "proxy_client",
    "world_tap_config",
]
