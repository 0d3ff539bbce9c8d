"""The emulated engines' Prometheus metrics, named and labelled as vLLM 0.32 names them.

Each engine has its own registry (label `engine`): the emulator's per-worker servers
render only theirs (a scrape costs what one engine costs), its data-parallel front renders
them all on one page (`FleetPage`), `engine="0"`, `engine="1"`, ... as one vLLM server
with data parallelism does. The stepping model (`shadow.world.engine_model`) feeds each
engine's `EngineMeter`.
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


class EngineMeter:
    """One engine's vLLM-named metrics, in its own registry (a per-engine page renders
    only its own families); what the stepping model tells it."""

    def __init__(self, model_name: str, engine: str) -> None:
        self.engine = engine
        self.registry = r = CollectorRegistry(auto_describe=False)
        names = ["model_name", "engine"]
        labels = (model_name, engine)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r).labels(*labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r).labels(*labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(*labels)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting.")
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            [*names, "reason"],
            registry=r,
        )
        self.waiting_by_reason = {w: by_reason.labels(*labels, w) for w in WAITING_REASONS}
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.success = {f: success.labels(*labels, f) for f in FINISHED_REASONS}
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
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


class FleetPage:
    """A collector of several engines' registries as one page (one family each, every
    engine's samples under it), as one vLLM server with data parallelism renders it."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self.registries = list(registries)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for registry in self.registries:
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    merged[family.name] = family
                else:
                    into.samples.extend(family.samples)
        yield from merged.values()
