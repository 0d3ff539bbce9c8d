"""A window's replay on the fleet as it was: per-worker slots (a draining worker takes
nothing, uneven B holds), and an A/A run that moves even for a deterministic incumbent."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from shadow.events.parse import iter_file
from shadow.policies import NO_KEY, ActiveSet, BalanceRouteConfig, make_policy
from shadow.predict import ExactMatchPredictor
from shadow.replay import InitialRequest, replay
from shadow.replay.workload import StepModel
from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
from shadow.service.store import ServiceStore
from shadow.stream.windows import AA, WINDOW_METRICS, WindowConfig, WindowSpec, evaluate_window
from shadow.workloads.synthetic import generate
from shadow.workloads.traces import retime
from tests.service_helpers import record

WORKERS, BATCH = 4, 16
MODEL = StepModel()


def _arrivals(n: int = 400, load: float = 0.9):
    workload = generate("paper-azure2024", seed=3, n=n)
    return retime(workload, load=load, workers=WORKERS, batch=BATCH, step_model=MODEL)


def _spec(policies, incumbent, capacity=None, initial=()):
    arrivals = _arrivals()
    return WindowSpec(
        fleet="f", index=4, t_start=0.0, t_end=float(arrivals.ready_s[-1]), workers=WORKERS,
        batch=BATCH, step_model=MODEL, policies=tuple(policies), incumbent=incumbent,
        balance_route=BalanceRouteConfig(), initial=tuple(initial), arrivals=arrivals,
        observed=dict.fromkeys(WINDOW_METRICS, math.nan), history=np.empty(0, dtype=np.int64),
        imputed=0, capacity=capacity,
    )  # fmt: skip


def test_a_draining_worker_decodes_what_it_holds_and_takes_nothing():
    held = InitialRequest(worker=0, prompt_tokens=2000, generated=10, remaining=300)
    result = replay(
        _arrivals(), make_policy("jsq"), workers=WORKERS, batch=BATCH, step_model=MODEL,
        initial=[held], capacity=[0, BATCH, 8, BATCH],
    )  # fmt: skip
    trace = ~result.from_initial
    assert not (result.worker[trace] == 0).any()  # nothing new on the draining worker
    assert result.worker_active[:, 0].max() == 1  # it still decodes the one it held
    assert result.finish_step[result.from_initial][0] == 299  # to its end
    assert result.worker_active[:, 2].max() == 8  # its own B, not the largest
    assert result.worker_active[:, [1, 3]].max() == BATCH


def test_capacity_is_checked():
    with pytest.raises(ValueError, match="capacity needs 4 values"):
        replay(_arrivals(10), make_policy("jsq"), workers=4, batch=8, capacity=[8, 8])
    with pytest.raises(ValueError, match="no worker takes requests"):
        replay(_arrivals(10), make_policy("jsq"), workers=4, batch=8, capacity=[0, 0, 0, 0])


def test_a_window_replays_its_draining_worker_without_new_work():
    result = evaluate_window(_spec(["jsq"], "jsq", capacity=(BATCH, 0, BATCH, BATCH)))
    assert result.trajectories["jsq"].loads[:, 1].max() == 0


@pytest.mark.parametrize("incumbent", ["rr", "jsq", "br0"])
def test_a_deterministic_incumbent_has_an_aa_noise_floor(incumbent):
    """`rr` has no random draws: the A/A run relabels the fleet's workers, so its start
    and its order fall elsewhere (and JSQ's ties are drawn at random besides). BR-0 has no
    ties left to draw either: its A/A draws the arrivals again within a step."""
    started = [InitialRequest(g, 3000 + 500 * g, 40 * g, 200 + 300 * g) for g in (0, 0, 1, 2)]
    metrics = evaluate_window(_spec([incumbent], incumbent, initial=started)).metrics
    same, other = metrics[incumbent], metrics[AA]
    assert same["steps"] > 0 and other["steps"] > 0
    assert any(same[k] != other[k] for k in ("imbalance_mean", "tpot_p95_ms", "gap_mean"))
    # the floor is noise, not another policy: within a few percent of the incumbent
    assert other["throughput_tok_s"] == pytest.approx(same["throughput_tok_s"], rel=0.05)


class _KeepingSpecs(ThreadPoolExecutor):
    """A real executor for the window replays that also keeps the specs it was given."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.specs: list[WindowSpec] = []

    def submit(self, fn, /, *args, **kwargs):
        self.specs.append(args[-1])  # the spec: the last argument in either window mode
        return super().submit(fn, *args, **kwargs)


def test_windows_hand_exactmatch_the_keyed_history(tmp_path):
    """ExactMatch learns by prompt key; the history a window hands its BR-H replays
    carries each completion's key, as the gate's calibration scores it."""
    log = tmp_path / "jsq.jsonl"
    _, workload = record(log, 1200, load=0.8)
    store = ServiceStore(tmp_path / "shadow.duckdb")
    executor = _KeepingSpecs()
    try:
        config = PipelineConfig(audit_enabled=False, windows=WindowConfig(policies=("jsq",)))
        pipeline = Pipeline(store, config, executor=executor)
        pipeline.start()
        for pairs, rejected in iter_file(log, batch_size=5000):
            pipeline.submit(pairs, rejected)
        pipeline.finish()
        pipeline.close()
    finally:
        executor.shutdown()
        store.close()
    later = [s for s in executor.specs if s.history.size]
    assert later and all(s.history_keys.shape == s.history.shape for s in later)
    keys = np.concatenate([s.history_keys for s in later])
    keyed = float((keys != NO_KEY).mean())
    share = float((workload.prompt_keys != NO_KEY).mean())  # the preset's templates
    assert keyed == pytest.approx(share, abs=0.05)

    # and they matter: ExactMatch trained on a window's keyed history predicts its keyed
    # requests otherwise than from the lengths alone (once a bucket holds min_samples)
    spec = max(later, key=lambda s: s.history.size)
    active = ActiveSet.from_arrays(
        [r.worker for r in spec.initial], [r.prompt_tokens for r in spec.initial],
        [r.generated for r in spec.initial], [r.prompt_key for r in spec.initial],
    )  # fmt: skip
    keyed_model, blind_model = ExactMatchPredictor(min_samples=2), ExactMatchPredictor(2)
    keyed_model.observe_many(spec.history, spec.history_keys)
    blind_model.observe_many(spec.history)
    moved = (
        keyed_model.predict(active, 80).contribution != blind_model.predict(active, 80).contribution
    )
    assert moved.any()
