"""`shadow bench replay --continuous`: the counterfactuals' cost is measured, not assumed."""

from __future__ import annotations

from shadow.bench.counterfactuals import run


def test_the_cost_counts_simulated_steps_and_costs_cpu():
    cost = run(requests=600, policies=("jsq-pool", "br0"), window_s=10.0)
    assert cost.windows >= 2 and cost.events > 10_000
    assert cost.simulated_steps > 0
    assert cost.cpu_on_s > cost.cpu_off_s > 0  # the counterfactuals are not free
    assert 0 < cost.us_per_simulated_step < 10_000
