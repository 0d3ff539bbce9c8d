"""The tap's own Prometheus metrics (`shadow_tap_*`), in a registry per tap so that
several taps (tests, benches) in one process do not share counters.

The event counters are read from the sink at scrape time (it already counts what it
sent and dropped), so the hot path pays nothing for them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

#: 10 us .. 50 ms: the target is a P99 under 1 ms on loopback
LATENCY_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2,
)  # fmt: skip
CONTENT_TYPE = CONTENT_TYPE_LATEST


class _PlainCounters(Collector):
    """Counters kept as plain integers on the hot path (a prometheus Counter takes a lock
    per increment, several per chunk) and the sink's own counts, read at scrape time."""

    def __init__(self, metrics: TapMetrics, read: Callable[[], tuple[int, int]]) -> None:
        self._metrics = metrics
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        chunks = CounterMetricFamily(
            "shadow_tap_chunks", "Response chunks passed through, by worker.", labels=["worker"]
        )
        sizes = CounterMetricFamily(
            "shadow_tap_bytes", "Response bytes passed through, by worker.", labels=["worker"]
        )
        for worker, (count, size) in sorted(self._metrics.passed.items()):
            chunks.add_metric([worker], count)
            sizes.add_metric([worker], size)
        yield chunks
        yield sizes
        sent, dropped = self._read()
        yield CounterMetricFamily(
            "shadow_tap_events_sent", "Events the tap delivered to the shadow service.", sent
        )
        yield CounterMetricFamily(
            "shadow_tap_events_dropped",
            "Events the tap dropped because its bounded buffer was full (service unreachable).",
            dropped,
        )


class PlainHistogram(Collector):
    """A histogram observed once per chunk without a lock (prometheus_client's takes one
    and walks its buckets in Python): one bisect and two additions. The tap observes
    from its event loop's thread only."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = list(buckets)
        #: per bucket, then the +Inf bucket: observations that fell in it (not cumulative)
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, running = [], 0
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            running += count
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=cumulative, sum_value=self.total
        )


class TapMetrics:
    def __init__(self, sink_counts: Callable[[], tuple[int, int]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "shadow_tap_requests", "Requests proxied, by worker and endpoint.",
            ["worker", "endpoint"], registry=r,
        )  # fmt: skip
        #: worker -> [chunks, bytes] passed through
        self.passed: dict[str, list[int]] = {}
        self.estimates = Counter(
            "shadow_tap_estimates",
            "Finishes whose token count is the tap's estimate from chunks (no usage seen).",
            registry=r,
        )
        self.upstream_errors = Counter(
            "shadow_tap_upstream_errors",
            "Upstream failures (unreachable, broken stream), by worker.", ["worker"], registry=r,
        )  # fmt: skip
        self.added_latency = PlainHistogram(
            "shadow_tap_added_latency_seconds",
            "Per chunk: from its arrival from the engine to its hand-off to the client.",
            LATENCY_BUCKETS,
        )
        r.register(self.added_latency)
        r.register(_PlainCounters(self, sink_counts))
        self.sched_slice = Gauge(
            "shadow_tap_sched_slice_seconds",
            "The relay thread's scheduling slice in force (tap.scheduling); 0 where the "
            "kernel shows none.", registry=r,
        )  # fmt: skip

    def set_sched_slice(self, microseconds: float | None) -> None:
        """The slice in force; None (the kernel reports none) leaves the gauge at 0."""
        if microseconds is not None:
            self.sched_slice.set(microseconds / 1e6)

    def render(self) -> bytes:
        return generate_latest(self.registry)
