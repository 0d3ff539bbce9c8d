"""The ingest path's window bookkeeping is kept incrementally (it ran per batch over
everything held): each incremental form must equal the full computation it replaced.

- `WindowTracker.due` counts each window's unfinished requests as finishes come, instead
  of rescanning every request of every waiting window on every batch;
- `StepSamples.array` converts only the steps added since the previous refit;
- `observed_window` lines the steps up with array operations, not a loop per step.
"""

from __future__ import annotations

import json
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.events import EVENT_ORDER, parse_ndjson
from shadow.policies import make_policy
from shadow.replay import replay
from shadow.replay.events import iter_events
from shadow.replay.workload import StepModel
from shadow.service.ingest.apply import Applier, FleetState
from shadow.service.ingest.pipeline import PipelineConfig
from shadow.service.ingest.step_samples import StepSamples
from shadow.stream.mirror import FleetMirror
from shadow.stream.trajectory import bucket
from shadow.stream.window_metrics import SealedSteps, observed_window, span_metrics, tpot_inside
from shadow.stream.window_state import TrackedRequest
from shadow.stream.windows import WindowConfig, WindowTracker
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime

# -- due -------------------------------------------------------------------------------


def _recorded_stream(seed: int, requests: int, drop_finishes: float) -> list:
    """A replayed fleet's events in stream order, a share of its finishes lost (those
    requests never finish: their windows wait for the lag or for the end)."""
    rng = np.random.default_rng(seed)
    model = StepModel()
    workload = retime(generate("paper-azure2024", seed=seed, n=requests), load=1.0,
                      workers=4, batch=8, step_model=model)  # fmt: skip
    policy = ("jsq-pool", "random", "br0")[seed % 3]
    result = replay(workload, make_policy(policy), workers=4, batch=8, step_model=model)
    lines = [json.dumps(e) for e in iter_events(result, workload.prompt_keys)
             if e["type"] != "finish" or rng.random() >= drop_finishes]  # fmt: skip
    events, errors = parse_ndjson("\n".join(lines))
    assert not errors
    return sorted((e for _, e in events), key=lambda e: (e.ts, EVENT_ORDER[e.type]))


def _due_by_scan(
    tracker: WindowTracker, now: float, force: bool, finished: list[int] | None = None
) -> list[int]:
    """`due` as it was: every request of every closed window looked up again (those
    due because all finished also go to `finished`)."""
    ready = []
    for index, window in tracker.windows.items():
        if window.t_end is None:
            continue
        if not window.workers or not window.batch or not window.request_ids():
            continue  # discarded by `due`
        done = all(tracker.requests[rid].output is not None
                   for rid in window.request_ids() if rid in tracker.requests)  # fmt: skip
        if force or done or now - window.t_end > tracker.config.max_lag_s:
            ready.append(index)
            if done and finished is not None:
                finished.append(index)
    return ready


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_incremental_due_equals_the_full_scan_on_random_streams(seed):
    windows = WindowConfig(length_s=3.0 + seed, max_lag_s=40.0 + 10 * seed)
    config = PipelineConfig(audit_enabled=False, windows=windows)
    states: dict[str, FleetState] = {}
    applier = Applier(config, lambda fleet: states.setdefault(fleet, FleetState(fleet, config)))
    events = _recorded_stream(seed, requests=300, drop_finishes=0.005 * seed)
    rng = np.random.default_rng(seed)
    checks = 0
    evaluated: list[int] = []
    finished: list[int] = []  # due as all their requests finished, not by the lag
    for ingest_id, event in enumerate(events):
        applier.apply(event, ingest_id, [], [], derive=True)
        if rng.random() > 0.1:  # the pipeline asks after each batch, not each event
            continue
        tracker = states[event.fleet].tracker
        now = tracker.mirror.now
        expected = _due_by_scan(tracker, now, force=False, finished=finished)
        assert tracker.due(now) == expected
        checks += 1
        for index in expected:
            tracker.spec(index, StepModel())
        evaluated += expected
    tracker = next(iter(states.values())).tracker
    tracker.close(tracker.mirror.now, final=True)
    expected = _due_by_scan(tracker, tracker.mirror.now, force=True)
    assert tracker.due(tracker.mirror.now, force=True) == expected
    for index in expected:
        tracker.spec(index, StepModel())
    lagged = set(evaluated) - set(finished)
    assert checks > 50 and finished and lagged and expected  # each way to be due
    assert not tracker.windows and not tracker.requests  # every hold released


def test_a_window_counts_its_unfinished_requests_once_per_hold():
    mirror = FleetMirror("f")
    mirror.apply_worker(0.0, "w0", 4, "up")
    tracker = WindowTracker("f", mirror, WindowConfig(length_s=1.0))
    tracker.before_event("ready", 0.1)
    mirror.apply_ready(0.1, "a", 10, 1)
    tracker.on_ready(0.1, "a")
    window = tracker.current
    assert window is not None and window.unfinished == 1
    tracker.on_finish(0.5, "a", 7, natural=True)
    assert window.unfinished == 0
    tracker.on_finish(0.6, "a", 8, natural=True)  # a corrected count: no second finish
    assert window.unfinished == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 150)), max_size=80))
def test_a_requests_held_windows_are_the_set_of_its_holds(operations):
    """The hold mask against a set of window indexes: any order of holds and releases,
    spans past 64 windows, holds below the first one."""
    info, holding = TrackedRequest(100, 1), set()
    for hold, index in operations:
        if hold:
            assert info.hold(index) == (index not in holding)
            holding.add(index)
        else:
            holding.discard(index)
            assert info.release(index) == bool(holding)
        assert list(info.held_by()) == sorted(holding)
        assert not holding or (info.first_window == min(holding) and info.held & 1)


def test_arrivals_after_a_quiet_fleets_window_was_closed_and_evaluated_go_to_the_next():
    """A flush on an idle fleet closes its window (`close`), which is then evaluated; the
    next request's events open the next window, contiguous with it (they went into the
    evaluated window: outside every window's evidence, and its finish then looked up a
    window no longer held)."""
    mirror = FleetMirror("f")
    mirror.apply_worker(0.0, "w0", 4, "up")
    tracker = WindowTracker("f", mirror, WindowConfig(length_s=30.0))

    def request(rid: str, ready: float, finish: float) -> None:
        tracker.before_event("ready", ready)
        mirror.apply_ready(ready, rid, 10, None)
        tracker.on_ready(ready, rid)
        tracker.before_event("dispatch", ready)
        mirror.apply_dispatch(ready, rid, "w0")
        tracker.on_dispatch(ready, rid)
        tracker.before_event("finish", finish)
        mirror.apply_finish(finish, rid, 5, "length")
        tracker.on_finish(finish, rid, 5, natural=True)

    request("a", 0.1, 0.5)
    tracker.close(mirror.now)  # idle, well before the 30 s boundary
    assert tracker.due(mirror.now) == [0]
    first = tracker.spec(0, StepModel())
    assert first.t_end == 0.5 and not tracker.requests
    request("b", 1.0, 1.4)
    window = tracker.current
    assert window is not None and window.index == 1
    assert window.t_start == first.t_end and window.arrivals == ["b"]
    assert window.unfinished == 0 and list(tracker.requests["b"].held_by()) == [1]
    tracker.close(mirror.now)
    assert tracker.due(mirror.now) == [1]
    assert tracker.spec(1, StepModel()).arrivals.output_tokens.tolist() == [5]
    assert not tracker.requests


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


# -- observed_window -------------------------------------------------------------------


def _observed_step_by_step(steps, t_start, t_end, workers, request_ids, queued, requests):
    """`observed_window` as it was written: a loop per step and per request."""
    held = sorted(
        (start, g, duration, kv, running)
        for (g, _), (start, duration, kv, running) in steps.items()
        if start >= t_start - 1e-9
    )
    starts_list, groups = [], []
    for entry in held:
        if starts_list and entry[0] - starts_list[-1] <= 1e-6:
            groups[-1].append(entry)
        else:
            starts_list.append(entry[0])
            groups.append([entry])
    starts = np.array(starts_list)
    durations = np.array([max(e[2] for e in group) for group in groups])
    running = np.array([sum(e[4] for e in group) for group in groups], dtype=np.int64)
    loads = np.zeros((len(groups), workers), dtype=np.int64)
    covering = {}
    for row, group in enumerate(groups):
        for start, g, duration, kv, _ in group:
            covering[g] = (start + duration / 1000.0, kv)
        for g, (end, kv) in covering.items():
            if end > starts[row] + 1e-9:
                loads[row, g] = kv
    keep = running > 0
    ends = starts + durations / 1000.0
    firsts, lasts, wait = [], [], []
    started = set(queued)
    for rid in request_ids:
        info = requests.get(rid)
        if info is None or (rid in started and info.dispatch_ts is None):
            continue
        dispatched = -np.inf if info.dispatch_ts is None else info.dispatch_ts
        finished = np.inf if info.finish_ts is None else info.finish_ts
        firsts.append(np.searchsorted(starts, dispatched - 1e-9, side="left"))
        lasts.append(np.searchsorted(ends, finished + 1e-9, side="right") - 1)
    for rid in queued:
        info = requests.get(rid)
        if info is not None and info.dispatch_ts is not None and info.ready_ts is not None:
            wait.append((info.dispatch_ts - max(info.ready_ts, t_start)) * 1000.0)
    tpot = tpot_inside(ends * 1000.0, np.array(firsts, dtype=np.int64),
                       np.array(lasts, dtype=np.int64))  # fmt: skip
    span_s = t_end - t_start
    metrics = span_metrics(starts[keep], durations[keep], loads[keep], running[keep], span_s,
                           tpot, np.array(wait))  # fmt: skip
    path = bucket((starts[keep] - t_start) * 1000.0, durations[keep], loads[keep], span_s * 1000.0)
    return metrics, path


def _random_window(seed: int, workers: int, lockstep: bool, jitter_s: float):
    """Steps of `workers` engines over ~10 s (in lockstep, or each on its own clock;
    `jitter_s` spreads starts that belong together, some chains past the 1e-6 s a row
    allows), and requests dispatched and finished at random moments."""
    rng = np.random.default_rng(seed)
    t_start, t_end = 100.0, 110.0
    steps = {}
    clocks = np.full(workers, t_start - 0.2) + (0 if lockstep else rng.uniform(0, 0.05, workers))
    number = np.zeros(workers, dtype=np.int64)
    while clocks.min() < t_end + 0.5:
        duration = float(rng.uniform(20.0, 90.0))
        for g in range(workers):
            if rng.random() < 0.1:
                clocks[g] += float(rng.uniform(0.0, 0.3))  # idle for a while
                continue
            start = float(clocks[g]) + (float(rng.uniform(0, jitter_s)) if jitter_s else 0.0)
            own = duration if lockstep else float(rng.uniform(20.0, 90.0))
            steps[(g, int(number[g]))] = (start, own, int(rng.integers(0, 5000)),
                                          int(rng.integers(0, 3)))  # fmt: skip
            number[g] += 1
            if not lockstep:
                clocks[g] = start + own / 1000.0
        if lockstep:
            clocks[:] = clocks.max() + duration / 1000.0
    requests, ids, queued = {}, [], []
    for i in range(60):
        rid = f"r{i}"
        ready = float(rng.uniform(t_start - 5, t_end))
        dispatch = ready + float(rng.uniform(0, 2)) if rng.random() < 0.85 else None
        finish = dispatch + float(rng.uniform(0, 8)) if dispatch and rng.random() < 0.6 else None
        requests[rid] = TrackedRequest(
            100, i, ready_ts=ready, dispatch_ts=dispatch, finish_ts=finish
        )
        ids.append(rid)
        if ready >= t_start or rng.random() < 0.3:
            queued.append(rid)
    requests.pop("r3")  # a request the tracker no longer knows
    return steps, (t_start, t_end, workers, ids, queued, requests)


def _assert_same(got, expected):
    (metrics, path), (want_metrics, want_path) = got, expected
    assert metrics.keys() == want_metrics.keys()
    for name, value in want_metrics.items():
        same = metrics[name]
        assert value == same or (math.isnan(value) and math.isnan(same)), name
    for field in ("t_ms", "loads", "imbalance", "gap", "step_ms"):
        np.testing.assert_array_equal(getattr(path, field), getattr(want_path, field))


@pytest.mark.parametrize(
    ("workers", "lockstep", "jitter_s"),
    [(1, True, 0.0), (4, True, 0.0), (8, True, 4e-7), (5, False, 0.0), (3, True, 3e-6)],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_observed_window_equals_the_step_by_step_definition(seed, workers, lockstep, jitter_s):
    steps, args = _random_window(seed, workers, lockstep, jitter_s)
    expected = _observed_step_by_step(steps, *args)
    assert expected[0]["steps"] > 50
    _assert_same(observed_window(steps, *args), expected)
    _assert_same(observed_window(SealedSteps.of(steps, args[0]), *args), expected)


def test_observed_window_of_no_steps():
    _, args = _random_window(0, 2, True, 0.0)
    _assert_same(observed_window({}, *args), _observed_step_by_step({}, *args))
