"""A window waiting for its requests to finish keeps its steps as columns (`SealedSteps`),
not as a dict of tuples: at G = 256 the dict held ~40 MiB a 30 s window, several at once.
Sealed steps give `observed_window` the very same metrics and trajectory."""

from __future__ import annotations

import math

import numpy as np

from shadow.stream.mirror import FleetMirror
from shadow.stream.window_metrics import SealedSteps, observed_window
from shadow.stream.window_state import TrackedRequest
from shadow.stream.windows import WindowConfig, WindowTracker

WORKERS = 3


def _steps(seed: int, n: int, t_start: float) -> dict[tuple[int, int], tuple]:
    """Unsynchronised workers' steps, some starting before the window (left out)."""
    rng = np.random.default_rng(seed)
    steps = {}
    for g in range(WORKERS):
        start = t_start - 0.3 + rng.uniform(0, 0.05)
        for number in range(n):
            duration = float(rng.uniform(20.0, 80.0))
            steps[(g, number)] = (start, duration, int(rng.integers(0, 5000)),
                                  int(rng.integers(0, 9)))  # fmt: skip
            start += duration / 1000.0 + (0.0 if rng.random() < 0.8 else 0.2)
    return steps


def test_sealed_steps_measure_the_window_exactly_as_the_dict():
    t_start, t_end = 10.0, 20.0
    steps = _steps(seed=5, n=200, t_start=t_start)
    requests = {
        "a": TrackedRequest(100, 1, ready_ts=9.0, dispatch_ts=10.5, finish_ts=15.0, output=90),
        "b": TrackedRequest(200, 2, ready_ts=11.0, dispatch_ts=12.25, finish_ts=None),
        "c": TrackedRequest(300, 3, ready_ts=12.0),  # never dispatched
    }
    args = (t_start, t_end, WORKERS, ["a", "b", "c"], ["b", "c"], requests)
    sealed = SealedSteps.of(steps, t_start)
    inside = sum(1 for start, *_ in steps.values() if start >= t_start)
    assert 0 < inside < len(steps) and sealed.start.shape == (inside,)
    metrics, path = observed_window(steps, *args)
    sealed_metrics, sealed_path = observed_window(sealed, *args)
    assert metrics.keys() == sealed_metrics.keys()
    for name, value in metrics.items():
        same = sealed_metrics[name]
        assert value == same or (math.isnan(value) and math.isnan(same)), name
    assert path.points > 0
    for field in ("t_ms", "loads", "imbalance", "gap", "step_ms"):
        np.testing.assert_array_equal(getattr(path, field), getattr(sealed_path, field))
    # the columns' bytes a step, against the dict's tuples (~300 bytes)
    assert sealed.nbytes / inside <= 36


def test_a_window_two_behind_the_open_one_holds_its_steps_sealed():
    mirror = FleetMirror("f")
    for g in range(WORKERS):
        mirror.apply_worker(0.0, f"w{g}", 8, "up")
    tracker = WindowTracker("f", mirror, WindowConfig(length_s=1.0))
    step = 0
    ts = 0.0
    while ts < 6.0:  # six windows of 1 s, steps of 50 ms on every worker
        ts = round(ts + 0.05, 6)
        for g in range(WORKERS):
            tracker.before_event("engine_step", ts)
            tracker.on_engine_step(ts, f"w{g}", step, 50.0, 1, 100 * g)
        step += 1
    current = tracker.current
    assert current is not None and current.index >= 4
    for index, window in tracker.windows.items():
        if index <= current.index - 2:
            assert window.sealed is not None and window.steps == {}, index
            assert window.sealed.start.shape[0] > 0
        else:
            assert window.sealed is None and window.steps, index
