"""`shadow tap`: the deployable tap, a transparent proxy between the incumbent router and
the decode engines that tells the shadow service what passes through.

Two ways to put it in the path (both can be mixed in one config):

- one listener per engine: `[[tap.engines]]` with `listen = "127.0.0.1:9001"`; point the
  router's engine URL at that address instead of the engine's;
- one shared listener (`[tap] listen = ...`) that picks the engine by a path prefix
  (`path_prefix = "/w0"`, stripped before forwarding: the router calls
  `http://tap/w0/v1/completions`) or by a header (`header = "w0"`: requests whose
  `route_header`, default `X-Shadow-Worker`, is `w0`).

`dp_rank` makes the tap set `X-data-parallel-rank`, so workers can be ranks of one vLLM
server with `--data-parallel-size`. The tap's own metrics (`shadow_tap_*`) are at
`/metrics` on the shared listener and on `metrics_listen`.

Modules: config (TOML and `--engine` values, checked), proxy (the ASGI proxy and its
events), metrics (its Prometheus registry), serve (listeners and the event sink).
"""

from shadow.connectors.tap.config import EngineConfig, TapConfig, TapConfigError
from shadow.connectors.tap.proxy import TapProxy

__all__ = ["EngineConfig", "TapConfig", "TapConfigError", "TapProxy"]
