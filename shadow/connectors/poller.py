"""Poll each decode engine's Prometheus `/metrics` to reconcile the fleet mirror.

The mirror is built from the tap's events; the engines' own gauges (running, waiting, KV
usage) are the independent check on it. Scrapes fail in the field (restarts, overload,
network), so the poller never raises: it counts failures, keeps the last good sample and
says when that sample is too old to trust (`stale`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

# Sample names, not family names: the parser strips `_total` from counter *families* but
# keeps it on the samples, and an untyped exposition keeps it everywhere.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
#: the histogram of tokens per engine iteration: `_count` counts iterations (the one
#: per-step signal on the page), `_sum` the tokens they scheduled (prefill included)
ITERATIONS = "vllm:iteration_tokens_total_count"
ITERATION_TOKENS = "vllm:iteration_tokens_total_sum"
_MAXED = frozenset({KV_USAGE, KV_USAGE_OLD})
_WANTED = frozenset(
    {RUNNING, WAITING, KV_USAGE, KV_USAGE_OLD, GENERATION_TOKENS, PREEMPTIONS, ITERATIONS,
     ITERATION_TOKENS}
)  # fmt: skip
DEFAULT_ENGINE = "0"


@dataclass(frozen=True)
class EngineSample:
    """One engine's load at one scrape; `kv_usage` is a fraction in [0, 1].

    `waiting_by_reason` splits `waiting` as vLLM does (`capacity`: waiting for a batch
    slot or KV blocks, preempted requests included; `deferred`: held back by a transient
    constraint such as a KV transfer from the prefill node); None when the page has no
    split (vLLM before it, the emulator). `iterations` and `iteration_tokens` are the
    engine's cumulative iteration count and the tokens those iterations scheduled;
    `preemptions` its cumulative preemption count. `requested_at` is when the poller
    sent the scrape (the page shows the engine at a moment between that and the
    sample's time, when the answer came); None for a page parsed without a scrape.
    """

    running: float
    waiting: float
    kv_usage: float | None
    generation_tokens: float | None
    waiting_by_reason: dict[str, float] | None = None
    iterations: float | None = None
    iteration_tokens: float | None = None
    preemptions: float | None = None
    #: when, not what: left out of equality (two scrapes of one page are equal samples)
    requested_at: float | None = field(default=None, compare=False)

    def waiting_for(self, reason: str) -> float:
        """Requests waiting for `reason` (0 when the page does not split waiting)."""
        return (self.waiting_by_reason or {}).get(reason, 0.0)


def parse_vllm_metrics(text: str) -> dict[str, EngineSample]:
    """Engine samples keyed by the `engine` label ("0" when the label is absent).

    Series of one engine under several `model_name`s are summed (running, waiting,
    tokens, counts; the largest KV usage is kept). An engine needs both request gauges to
    count. `vllm:gpu_cache_usage_perc` (vLLM < 0.9) stands in when `kv_cache_usage_perc`
    is absent. Text that is not Prometheus exposition raises `ValueError`. CPU-bound (a
    DP page of vLLM 0.32 is ~80 KB per two engines): the poller runs it off the loop.
    """
    values: dict[str, dict[str, float]] = {}
    reasons: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if name == WAITING_BY_REASON:
                    engine = sample.labels.get("engine", DEFAULT_ENGINE)
                    reason = sample.labels.get("reason", "unknown")
                    split = reasons.setdefault(engine, {})
                    split[reason] = split.get(reason, 0.0) + float(sample.value)
                    continue
                if name not in _WANTED:
                    continue
                engine = sample.labels.get("engine", DEFAULT_ENGINE)
                per_engine = values.setdefault(engine, {})
                value = float(sample.value)
                if name in _MAXED:
                    per_engine[name] = max(per_engine.get(name, value), value)
                else:
                    per_engine[name] = per_engine.get(name, 0.0) + value
    except ValueError as exc:
        snippet = text[:80].replace("\n", "\\n")
        raise ValueError(f"not Prometheus text exposition ({exc}); starts {snippet!r}") from exc
    samples: dict[str, EngineSample] = {}
    for engine, metrics in values.items():
        if RUNNING not in metrics or WAITING not in metrics:
            continue
        samples[engine] = EngineSample(
            running=metrics[RUNNING],
            waiting=metrics[WAITING],
            kv_usage=metrics.get(KV_USAGE, metrics.get(KV_USAGE_OLD)),
            generation_tokens=metrics.get(GENERATION_TOKENS),
            waiting_by_reason=reasons.get(engine),
            iterations=metrics.get(ITERATIONS),
            iteration_tokens=metrics.get(ITERATION_TOKENS),
            preemptions=metrics.get(PREEMPTIONS),
        )
    return samples


@dataclass(frozen=True)
class Target:
    """One decode worker: `url` is the engine's base URL (scraped at `url + "/metrics"`).

    `engine` is the DP rank label (`engine="<rank>"`) of this worker on a page that serves
    several engines (vLLM with `--data-parallel-size`). Without it: the page's only
    engine, else the engine labelled like `worker`; never a guess (see `select_sample`).
    """

    worker: str
    url: str
    engine: str | None = None

    @property
    def metrics_url(self) -> str:
        return self.url.rstrip("/") + "/metrics"


def select_sample(target: Target, samples: dict[str, EngineSample]) -> EngineSample:
    """The sample that belongs to `target` (see `Target`); `ValueError` when there is none.

    A page of several engines and a target without `engine` whose worker name is no
    label is an error: reading engine 0 for it would silently report another worker.
    """
    if not samples:
        raise ValueError("no vLLM engine metrics (num_requests_running/waiting) in the text")
    if target.engine is not None:
        if target.engine not in samples:
            raise ValueError(f"engine {target.engine!r} not in metrics (has {sorted(samples)})")
        return samples[target.engine]
    if target.worker in samples:
        return samples[target.worker]
    if len(samples) == 1:
        return next(iter(samples.values()))
    raise ValueError(
        f"the page serves engines {sorted(samples)}: set `engine` on the [[engines]] entry "
        f"of worker {target.worker!r}"
    )


def unknown_engines(targets: list[Target], samples: dict[str, EngineSample]) -> list[str]:
    """Ranks on a page that none of the page's `targets` names (sorted).

    A page of one engine read by one target without `engine` names that engine; any
    other rank must be claimed by a target's `engine`, or by a worker named like it.
    """
    if len(samples) == 1 and len(targets) == 1 and targets[0].engine is None:
        return []
    return sorted(set(samples) - _claims(targets))


def _claims(page: list[Target]) -> set[str]:
    return {t.engine if t.engine is not None else t.worker for t in page}


@dataclass
class _TargetState:
    sample: EngineSample | None = None
    sampled_at: float | None = None
    failures: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None


class MetricsPoller:
    """Scrapes every engine page every `interval_s`, each page on its own task.

    Targets sharing a URL (the ranks of one data-parallel vLLM) share one page: it is
    fetched once per tick and parsed once, in a thread, since an 80 KB exposition parsed
    on the event loop would stall ingest; each target then takes its rank's sample. One
    task per page, so a page that hangs until `timeout_s` never delays the others.
    A rank on a page that no target names is an error naming it (logged once, kept in
    `page_errors` and each of that page's workers' `status()`); the named ranks are still
    read. `on_sample(worker, ts, sample)` runs on the event loop after each good scrape
    (`ts` is `time.time()`); an exception from it is logged, never fatal.
    """

    def __init__(
        self,
        targets: list[Target],
        *,
        interval_s: float = 0.5,
        timeout_s: float = 1.0,
        staleness_s: float = 3.0,
        on_sample: Callable[[str, float, EngineSample], None] | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        workers = [target.worker for target in targets]
        if len(set(workers)) != len(workers):
            raise ValueError(f"duplicate worker names in targets: {workers}")
        for name, value in (
            ("interval_s", interval_s),
            ("timeout_s", timeout_s),
            ("staleness_s", staleness_s),
        ):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value}")
        self.targets = list(targets)
        self.pages: dict[str, list[Target]] = {}
        for target in self.targets:
            self.pages.setdefault(target.metrics_url, []).append(target)
        for url, page in self.pages.items():
            engines = [t.engine for t in page if t.engine is not None]
            if len(set(engines)) != len(engines):
                raise ValueError(f"engine named twice for {url}: {sorted(engines)}")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.staleness_s = staleness_s
        self.on_sample = on_sample
        self._client = client
        self._owns_client = client is None
        self._state = {target.worker: _TargetState() for target in self.targets}
        #: per page URL: the errors of its last good fetch (unknown ranks)
        self.page_errors: dict[str, list[str]] = {url: [] for url in self.pages}
        self._logged: set[tuple[str, str]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._started_at: float | None = None

    @property
    def failures(self) -> dict[str, int]:
        """Failed scrapes per worker since construction."""
        return {worker: state.failures for worker, state in self._state.items()}

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    async def __aenter__(self) -> MetricsPoller:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start one polling task per page (no-op when already running)."""
        if self._tasks:
            return
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout_s,
                limits=httpx.Limits(max_connections=max(10, 2 * len(self.pages))),
            )
            self._owns_client = True
        self._started_at = time.time()
        self._stopping = False
        self._tasks = [
            asyncio.create_task(self._run(url), name=f"metrics-poller:{url}") for url in self.pages
        ]

    async def stop(self) -> None:
        """Cancel the polling tasks and close the client if the poller made it."""
        tasks, self._tasks = self._tasks, []
        self._stopping = True
        for task in tasks:
            task.cancel()
        if tasks:
            # `wait`, not `await task` under suppress(CancelledError): that also ate a
            # cancellation of this `stop` itself
            await asyncio.wait(tasks)
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def poll_once(self) -> None:
        """Scrape every page once, concurrently (what each tick does); before `start()`,
        with a client made for this call."""
        if self._client is not None:
            await asyncio.gather(*(self._scrape(url) for url in self.pages))
            return
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            self._client = client
            try:
                await asyncio.gather(*(self._scrape(url) for url in self.pages))
            finally:
                self._client = None

    async def _run(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            await self._scrape(url)
            # not ended by a cancel alone: Python 3.11's `wait_for` (in `_scrape`) drops
            # a cancellation that lands in the tick the fetch finished, and the poller
            # went on scraping with `stop` waiting on it for ever
            if self._stopping:
                return
            next_tick += self.interval_s
            now = loop.time()
            if next_tick < now:  # a slow scrape: skip the missed ticks, keep the cadence
                next_tick += math.ceil((now - next_tick) / self.interval_s) * self.interval_s
            await asyncio.sleep(next_tick - now)

    async def _fetch(self, url: str) -> tuple[float, dict[str, EngineSample]]:
        """The page's samples and when its answer came (before parsing, which may wait
        for a thread), each sample stamped with when the request was sent."""
        if self._client is None:
            raise RuntimeError("poller client is closed")
        requested_at = time.time()
        response = await self._client.get(url, timeout=self.timeout_s)
        answered_at = time.time()
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code} from {url}")
        samples = await asyncio.to_thread(parse_vllm_metrics, response.text)
        stamped = {rank: replace(s, requested_at=requested_at) for rank, s in samples.items()}
        return answered_at, stamped

    def _fail(self, state: _TargetState, error: str) -> None:
        state.failures += 1
        state.consecutive_failures += 1
        state.last_error = error

    async def _scrape(self, url: str) -> None:
        page = self.pages[url]
        try:
            # httpx's timeout is per operation; a server trickling bytes needs a total bound.
            ts, samples = await asyncio.wait_for(self._fetch(url), self.timeout_s)
        except Exception as exc:  # any failure only marks the targets; it never stops polling
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError | httpx.TimeoutException):
                reason = f"timeout after {self.timeout_s} s"
            for target in page:
                self._fail(self._state[target.worker], f"{type(exc).__name__}: {reason}")
            return
        unknown = unknown_engines(page, samples)
        self.page_errors[url] = [
            f"engine {rank!r} on {url} is named by no [[engines]] entry" for rank in unknown
        ]
        for rank, error in zip(unknown, self.page_errors[url], strict=True):
            if (url, rank) not in self._logged:
                self._logged.add((url, rank))
                logger.error("%s (entries name %s)", error, sorted(_claims(page)))
        for target in page:
            state = self._state[target.worker]
            try:
                sample = select_sample(target, samples)
            except ValueError as exc:
                self._fail(state, f"ValueError: {exc}")
                continue
            state.sample = sample
            state.sampled_at = ts
            state.consecutive_failures = 0
            if self.on_sample is not None:
                try:
                    self.on_sample(target.worker, ts, sample)
                except Exception:
                    logger.exception("on_sample failed for worker %s", target.worker)

    def latest(self, worker: str) -> tuple[float, EngineSample] | None:
        """The last good sample of `worker` and when it was taken, or None."""
        state = self._state[worker]
        if state.sample is None or state.sampled_at is None:
            return None
        return state.sampled_at, state.sample

    def stale(self, worker: str, now: float | None = None) -> bool:
        """True when `worker`'s last good sample is older than `staleness_s`.

        With no sample yet: stale once `staleness_s` has passed since `start()` (and before
        `start()`, since nothing is known).
        """
        state = self._state[worker]
        now = time.time() if now is None else now
        if state.sampled_at is not None:
            return now - state.sampled_at > self.staleness_s
        if self._started_at is None:
            return True
        return now - self._started_at > self.staleness_s

    def status(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Per worker: last sample, its age, staleness, failure counts and the last error."""
        now = time.time() if now is None else now
        result: dict[str, dict[str, Any]] = {}
        for target in self.targets:
            state = self._state[target.worker]
            result[target.worker] = {
                "url": target.url,
                "engine": target.engine,
                "sample": None if state.sample is None else asdict(state.sample),
                "sampled_at": state.sampled_at,
                "age_s": None if state.sampled_at is None else now - state.sampled_at,
                "stale": self.stale(target.worker, now),
                "failures": state.failures,
                "consecutive_failures": state.consecutive_failures,
                "last_error": state.last_error,
                "page_errors": list(self.page_errors[target.metrics_url]),
            }
        return result
