"""The ingest path's window bookkeeping is kept incrementally (it ran per batch over
everything held): each incremental form must equal the full computation it replaced.

- `WindowTracker.due` counts each window's unfinished requests as finishes come, instead
  of rescanning every request of every waiting window on every batch;
- `StepSamples.array` converts only the steps added since the previous refit;
- `observed_window` lines the steps up with array operations, not a loop per step.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from shadow.service.ingest.step_samples import StepSamples

# -- step samples ----------------------------------------------------------------------


def test_step_samples_array_equals_converting_every_kept_row():
    rng = np.random.default_rng(7)
    limit = 500
    samples, whole = StepSamples(limit), deque(maxlen=limit)
    assert not samples
    step = 0
    for _ in range(60):
        for _ in range(int(rng.choice([0, 3, 40, 499, 500, 1200]))):
            row = (step, int(rng.integers(0, 10**6)), float(rng.uniform(5, 90)), step * 0.05)
            samples.append(row)
            whole.append(row)
            step += 1
        assert len(samples) == len(whole)
        if whole:
            np.testing.assert_array_equal(samples.array(), np.array(whole, dtype=np.float64))
