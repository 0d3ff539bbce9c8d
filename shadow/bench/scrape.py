"""Values read from a service's `/metrics` text by the benchmarks that drive it over
HTTP (`bench load`, `bench fleet`): the numbers a run reports beside its own clocks."""

from __future__ import annotations


def metric_value(text: str, name: str) -> float:
    """The first series of metric `name` (labelled or not); 0.0 when it is absent."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def metric_sum(text: str, name: str) -> float:
    """The sum of a labelled metric's series (every fleet's, every tag's)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))  # fmt: skip
