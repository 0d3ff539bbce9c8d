"""The emulated engines' Prometheus metrics, named and labelled as vLLM 0.32 names them.

One registry holds every engine of a fleet (label `engine`), as one vLLM server with
data parallelism does: its `/metrics` page lists `engine="0"`, `engine="1"`, ... The
emulator's per-worker servers each show only their own engine (`EngineView`), its
data-parallel front shows them all. The stepping model (`shadow.world.engine_model`)
feeds each engine's `EngineMeter`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

# vLLM's buckets for inter-token latency and for tokens per engine step.
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: the reasons vLLM counts in `vllm:request_success` (an engine error is not a success)
FINISHED_REASONS = ("stop", "length", "abort", "tool_calls", "repetition")
WAITING_REASONS = ("capacity", "deferred")


class EngineMetrics:
    """The metric families of one fleet, in their own registry."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=False)
        names = ["model_name", "engine"]
        r = self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution.", names,
            registry=r,
        )  # fmt: skip
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting.", names, registry=r
        )
        self.waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            [*names, "reason"],
            registry=r,
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.", names, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", names, registry=r
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            names,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            names,
            buckets=ITERATION_TOKEN_BUCKETS,
            registry=r,
        )

    def engine(self, engine: str) -> EngineMeter:
        return EngineMeter(self, engine)


class EngineMeter:
    """One engine's children of the fleet's families; what the stepping model tells it."""

    def __init__(self, metrics: EngineMetrics, engine: str) -> None:
        labels = (metrics.model_name, engine)
        self.engine = engine
        self.running = metrics.running.labels(*labels)
        self.waiting = metrics.waiting.labels(*labels)
        self.waiting_by_reason = {
            reason: metrics.waiting_by_reason.labels(*labels, reason) for reason in WAITING_REASONS
        }
        self.kv_usage = metrics.kv_usage.labels(*labels)
        self.generation_tokens = metrics.generation_tokens.labels(*labels)
        self.prompt_tokens = metrics.prompt_tokens.labels(*labels)
        self.success = {r: metrics.success.labels(*labels, r) for r in FINISHED_REASONS}
        self.itl = metrics.itl.labels(*labels)
        self.iteration_tokens = metrics.iteration_tokens.labels(*labels)
        self._prefilled = 0  # prompt tokens admitted since the last step: part of its tokens

    def admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self._prefilled += prompt_tokens

    def stepped(
        self, produced: int, finished: list[str], itl_samples: int, duration_s: float
    ) -> None:
        if produced:
            self.generation_tokens.inc(produced)
            # vLLM observes the tokens an iteration scheduled: the prefills it admitted
            # and one decode token per running request
            self.iteration_tokens.observe(produced + self._prefilled)
            self._prefilled = 0
        for reason in finished:
            counter = self.success.get(reason)
            if counter is not None:
                counter.inc()
        observe = self.itl.observe
        for _ in range(itl_samples):
            observe(duration_s)

    def aborted(self) -> None:
        self.success["abort"].inc()

    def sample(self, running: int, waiting: int, kv_usage: float) -> None:
        """Set the gauges to the engine's state now (just before a page is rendered)."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_by_reason["capacity"].set(waiting)
        self.kv_usage.set(kv_usage)


class EngineView:
    """A collector showing only some engines' samples of a registry: a page per server."""

    def __init__(self, registry: CollectorRegistry, engines: Iterable[str]) -> None:
        self.registry = registry
        self.engines = frozenset(engines)

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if s.labels.get("engine") in self.engines]
            yield family
