"""The tap's configuration: which engines it fronts, where it listens, where events go.

A TOML file (`shadow tap --config tap.toml`) holds a `[tap]` table and its
`[[tap.engines]]`; `--engine worker=w0,upstream=http://...,listen=...` adds engines from
the command line, and options override the file's top-level keys. Every error names the
field it is about (`tap.engines[1].upstream: ...`), so a fleet's config is fixed from the
message alone.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shadow.connectors.tap.scheduling import DEFAULT_SLICE_US

#: what a request's id in the events is (see `TapConfig.request_ids`)
REQUEST_ID_SCHEMES = ("engine", "header")
_ENGINE_KEYS = ("worker", "upstream", "listen", "path_prefix", "header", "dp_rank", "capacity")
_TAP_KEYS = (
    "service", "token_file", "fleet", "source", "listen", "route_header", "metrics_listen",
    "progress_interval_s", "flush_interval_s", "request_ids", "policy", "emit_ready",
    "max_buffer", "sched_slice_us", "engines",
)  # fmt: skip


class TapConfigError(ValueError):
    """A configuration value that cannot work; the message starts with the field."""


@dataclass(frozen=True)
class EngineConfig:
    """One decode engine behind the tap, and how a request reaches it.

    Exactly one of: `listen` (a listener of its own), `path_prefix` (on the shared
    listener; the prefix is stripped before forwarding), `header` (on the shared
    listener: requests whose `route_header` has this value). `dp_rank` pins a vLLM
    data-parallel rank (the tap sets `X-data-parallel-rank`), so several workers can be
    ranks of one vLLM server behind one upstream URL.
    """

    worker: str
    upstream: str
    listen: tuple[str, int] | None = None
    path_prefix: str | None = None
    header: str | None = None
    dp_rank: int | None = None
    capacity: int | None = None


@dataclass(frozen=True)
class TapConfig:
    service: str | None = None
    token_file: Path | None = None
    fleet: str = "default"
    #: the sink's source name (the service de-duplicates by source and seq)
    source: str = "tap"
    #: the shared listener, for engines matched by path prefix or header
    listen: tuple[str, int] | None = None
    route_header: str = "x-shadow-worker"
    #: where the tap's own /metrics is served besides the shared listener
    metrics_listen: tuple[str, int] | None = None
    progress_interval_s: float = 0.1
    #: how often the tap posts its buffered events to the service: each post is a request
    #: of its own, a cost per second whatever the traffic (at 0.05 s, a fifth of the
    #: tap's CPU at 1,000 chunks/s); the service reorders events within seconds anyway
    flush_interval_s: float = 0.25
    #: "engine": the id vLLM's engine gives the request (`cmpl-<X-Request-Id>-0`,
    #: `chatcmpl-<X-Request-Id>`), which the stat-logger plugin reports at finish, so the
    #: service joins the two; "header": the X-Request-Id itself, for a router that
    #: announces `ready` under that id
    request_ids: str = "engine"
    policy: str = "unknown"
    #: False when the router announces `ready` itself
    emit_ready: bool = True
    max_buffer: int = 100_000
    #: the relay thread's scheduling slice asked of Linux (`tap.scheduling`), microseconds;
    #: 0 asks nothing (the slice stays as inherited, normally the kernel's)
    sched_slice_us: int = DEFAULT_SLICE_US
    engines: tuple[EngineConfig, ...] = field(default_factory=tuple)


def _address(value: object, name: str) -> tuple[str, int]:
    if not isinstance(value, str) or value.count(":") < 1:
        raise TapConfigError(f"{name}: expected host:port, got {value!r}")
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise TapConfigError(
            f"{name}: expected host:port (port 0..65535; 0: any free one), got {value!r}"
        )
    return host, int(port)


def _url(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TapConfigError(f"{name}: expected an http(s) URL, got {value!r}")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TapConfigError(f"{name}: expected an http(s) URL, got {value!r}")
    return value.rstrip("/")


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TapConfigError(f"{name}: expected a non-empty string, got {value!r}")
    return value.strip()


def _int(value: object, name: str, low: int) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TapConfigError(f"{name}: expected an integer >= {low}, got {value!r}")
    return value


def engine_from_mapping(raw: dict[str, Any], name: str) -> EngineConfig:
    """One `[[tap.engines]]` table (or `--engine` value) as an EngineConfig."""
    unknown = sorted(set(raw) - set(_ENGINE_KEYS))
    if unknown:
        raise TapConfigError(
            f"{name}.{unknown[0]}: unknown key; expected one of {', '.join(_ENGINE_KEYS)}"
        )
    if "worker" not in raw:
        raise TapConfigError(f"{name}.worker: required")
    if "upstream" not in raw:
        raise TapConfigError(f"{name}.upstream: required")
    prefix = raw.get("path_prefix")
    if prefix is not None:
        prefix = "/" + _text(prefix, f"{name}.path_prefix").strip("/")
        if prefix == "/":
            raise TapConfigError(f"{name}.path_prefix: must not be '/' (it would match all)")
    engine = EngineConfig(
        worker=_text(raw["worker"], f"{name}.worker"),
        upstream=_url(raw["upstream"], f"{name}.upstream"),
        listen=None if raw.get("listen") is None else _address(raw["listen"], f"{name}.listen"),
        path_prefix=prefix,
        header=None if raw.get("header") is None else _text(raw["header"], f"{name}.header"),
        dp_rank=None if raw.get("dp_rank") is None else _int(raw["dp_rank"], f"{name}.dp_rank", 0),
        capacity=None
        if raw.get("capacity") is None
        else _int(raw["capacity"], f"{name}.capacity", 1),
    )
    matches = [k for k in ("listen", "path_prefix", "header") if getattr(engine, k) is not None]
    if len(matches) != 1:
        raise TapConfigError(
            f"{name}: set exactly one of listen, path_prefix, header (got "
            f"{', '.join(matches) or 'none'})"
        )
    return engine


def parse_engine_option(value: str, index: int) -> EngineConfig:
    """`worker=w0,upstream=http://...,listen=127.0.0.1:9001,dp_rank=0` (one `--engine`)."""
    raw: dict[str, str] = {}
    for part in value.split(","):
        key, sep, item = part.partition("=")
        if not sep:
            raise TapConfigError(f"--engine[{index}]: expected key=value pairs, got {part!r}")
        raw[key.strip()] = item.strip()
    return engine_from_mapping(raw, f"--engine[{index}]")


def config_from_mapping(raw: dict[str, Any]) -> TapConfig:
    """The `[tap]` table of a parsed TOML document."""
    tap = raw.get("tap", {})
    if not isinstance(tap, dict):
        raise TapConfigError("tap: expected a table")
    unknown = sorted(set(tap) - set(_TAP_KEYS))
    if unknown:
        expected = ", ".join(_TAP_KEYS)
        raise TapConfigError(f"tap.{unknown[0]}: unknown key; expected one of {expected}")
    engines = tap.get("engines", [])
    if not isinstance(engines, list) or not all(isinstance(e, dict) for e in engines):
        raise TapConfigError("tap.engines: expected an array of tables ([[tap.engines]])")
    values: dict[str, Any] = {
        "engines": tuple(engine_from_mapping(e, f"tap.engines[{i}]") for i, e in enumerate(engines))
    }
    if "service" in tap:
        values["service"] = _url(tap["service"], "tap.service")
    if "token_file" in tap:
        values["token_file"] = Path(_text(tap["token_file"], "tap.token_file"))
    for key in ("fleet", "source", "route_header", "policy", "request_ids"):
        if key in tap:
            values[key] = _text(tap[key], f"tap.{key}")
    for key in ("listen", "metrics_listen"):
        if key in tap:
            values[key] = _address(tap[key], f"tap.{key}")
    for key, low in (("progress_interval_s", 0.0), ("flush_interval_s", 0.001)):
        if key in tap:
            interval = tap[key]
            number = isinstance(interval, (int, float)) and not isinstance(interval, bool)
            if not number or interval < low:
                raise TapConfigError(f"tap.{key}: expected seconds >= {low:g}, got {interval!r}")
            values[key] = float(interval)
    if "emit_ready" in tap:
        if not isinstance(tap["emit_ready"], bool):
            got = tap["emit_ready"]
            raise TapConfigError(f"tap.emit_ready: expected true or false, got {got!r}")
        values["emit_ready"] = tap["emit_ready"]
    if "max_buffer" in tap:
        values["max_buffer"] = _int(tap["max_buffer"], "tap.max_buffer", 1)
    if "sched_slice_us" in tap:
        values["sched_slice_us"] = _int(tap["sched_slice_us"], "tap.sched_slice_us", 0)
    return TapConfig(**values)


def load_config(path: Path) -> TapConfig:
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as error:
        raise TapConfigError(f"--config: cannot read {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise TapConfigError(f"--config: {path} is not valid TOML: {error}") from None
    return config_from_mapping(raw)


def with_engines(config: TapConfig, extra: list[EngineConfig], **overrides: Any) -> TapConfig:
    """`config` plus command-line engines and options (None leaves a value as it is)."""
    values = {k: v for k, v in overrides.items() if v is not None}
    if "listen" in values and isinstance(values["listen"], str):
        values["listen"] = _address(values["listen"], "--listen")
    if "metrics_listen" in values and isinstance(values["metrics_listen"], str):
        values["metrics_listen"] = _address(values["metrics_listen"], "--metrics-listen")
    if "service" in values:
        values["service"] = _url(values["service"], "--service")
    return replace(config, engines=(*config.engines, *extra), **values)


def validate(config: TapConfig, *, need_service: bool = True) -> TapConfig:
    """Checks across fields: names unique, listeners free of clashes, a service to send to."""
    if not config.engines:
        raise TapConfigError(
            "tap.engines: at least one engine is required ([[tap.engines]] or --engine)"
        )
    if config.request_ids not in REQUEST_ID_SCHEMES:
        raise TapConfigError(
            f"tap.request_ids: expected one of {', '.join(REQUEST_ID_SCHEMES)}, "
            f"got {config.request_ids!r}"
        )
    if need_service and config.service is None:
        raise TapConfigError("tap.service: required (--service URL or service = ... in [tap])")
    seen: dict[str, int] = {}
    listens: dict[tuple[str, int], str] = {}
    routes: dict[tuple[str, str], str] = {}
    for i, engine in enumerate(config.engines):
        name = f"tap.engines[{i}]"
        if engine.worker in seen:
            raise TapConfigError(
                f"{name}.worker: {engine.worker!r} is also tap.engines[{seen[engine.worker]}]"
            )
        seen[engine.worker] = i
        if engine.listen is not None:
            shared = (config.listen, config.metrics_listen)
            taken = engine.listen in listens or engine.listen in shared
            if taken and engine.listen[1] != 0:  # port 0: each listener gets a free port
                host, port = engine.listen
                raise TapConfigError(f"{name}.listen: {host}:{port} is used twice")
            listens[engine.listen] = engine.worker
            continue
        if config.listen is None:
            kind = "path_prefix" if engine.path_prefix is not None else "header"
            raise TapConfigError(
                f"{name}.{kind}: needs the shared listener (tap.listen or --listen)"
            )
        if engine.path_prefix is not None:
            key = ("path_prefix", engine.path_prefix)
        else:
            key = ("header", engine.header or "")
        if key in routes:
            raise TapConfigError(f"{name}.{key[0]}: {key[1]!r} also routes to {routes[key]!r}")
        routes[key] = engine.worker
    if config.listen is None and config.metrics_listen is None:
        raise TapConfigError(
            "tap.metrics_listen: required when there is no shared listener (tap.listen): "
            "the tap's /metrics needs an address"
        )
    return config


def read_token(path: Path | None) -> str | None:
    """The bearer token in `path` (surrounding whitespace ignored); never echoed."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as error:
        raise TapConfigError(f"--token-file: cannot read {path}: {error.strerror}") from None
    if not token:
        raise TapConfigError(f"--token-file: {path} is empty")
    return token
