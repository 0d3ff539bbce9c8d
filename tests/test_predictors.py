import numpy as np
import pytest

from shadow.policies import NO_KEY, ActiveSet, prompt_key_id
from shadow.predict import (
    ExactMatchPredictor,
    OraclePredictor,
    SurvivalPredictor,
    calibrate,
    roc_auc,
)


def active(generated, keys=None, remaining=None):
    n = len(generated)
    return ActiveSet.from_arrays(np.zeros(n), np.zeros(n), generated, keys, remaining)


@pytest.mark.parametrize("age", [0, 50, 400, 1000, 1023, 1100])
def test_survival_matches_monte_carlo_within_one_percent(age):
    rng = np.random.default_rng(11)
    history = np.concatenate(
        [np.full(3000, 1024), 1001 + rng.geometric(1 / 60, 2000), rng.integers(1, 1500, 5000)]
    )
    predictor = SurvivalPredictor()
    predictor.observe_many(history)
    horizon = 80
    predicted = predictor.predict(active([age]), horizon).contribution[0]
    survivors = history[history > age]
    draws = rng.choice(survivors, 400_000)
    monte_carlo = np.minimum(draws - age, horizon + 1).mean()
    assert predicted == pytest.approx(monte_carlo, rel=0.01)
    exact = np.minimum(survivors - age, horizon + 1).mean()
    assert predicted == pytest.approx(exact, rel=1e-12)


def test_survival_beyond_the_history_survives_the_whole_horizon():
    predictor = SurvivalPredictor()
    predictor.observe_many(np.array([10, 20, 30]))
    prediction = predictor.predict(active([30, 500]), 80)
    assert prediction.contribution.tolist() == [81.0, 81.0]
    assert prediction.finish_probability.tolist() == [0.0, 0.0]


def test_survival_learns_incrementally_like_in_one_batch():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 400, 500)
    batch, incremental = SurvivalPredictor(), SurvivalPredictor()
    batch.observe_many(lengths)
    for length in lengths:
        incremental.observe(int(length))
    ages = active(np.arange(0, 400, 7))
    assert np.array_equal(
        batch.predict(ages, 40).contribution, incremental.predict(ages, 40).contribution
    )
    assert np.array_equal(batch._counts, incremental._counts)


def test_survival_refuses_an_empty_output_one_at_a_time_as_in_a_batch():
    predictor = SurvivalPredictor()
    with pytest.raises(ValueError, match=">= 1"):
        predictor.observe(0)
    with pytest.raises(ValueError, match=">= 1"):
        predictor.observe_many(np.array([3, 0]))
    assert len(predictor) == 0


def test_exactmatch_uses_the_bucket_once_it_has_enough_samples():
    predictor = ExactMatchPredictor(min_samples=3)
    predictor.observe_many(np.array([1000] * 50))  # unkeyed history: long requests
    predictor.observe_many(np.array([5, 5]), np.array([42, 42]))
    request = active([0], keys=[42])
    # Two samples: too few, so Survival over everything answers.
    fallback = SurvivalPredictor()
    fallback.observe_many(np.array([1000] * 50 + [5, 5]))
    assert predictor.predict(request, 80).contribution[0] == pytest.approx(
        fallback.predict(request, 80).contribution[0]
    )
    predictor.observe(5, 42)
    fallback.observe(5)
    assert predictor.predict(request, 80).contribution[0] == 5.0
    assert predictor.predict(request, 80).finish_probability[0] == 1.0
    # An unknown key and a missing key fall back too.
    other = active([0, 0], keys=[7, NO_KEY])
    assert (
        predictor.predict(other, 80).contribution.tolist()
        == [pytest.approx(fallback.predict(other, 80).contribution[0])] * 2
    )


def test_exactmatch_string_keys_via_observe():
    predictor = ExactMatchPredictor(min_samples=1)
    predictor.observe(12, "template-a")
    request = active([2], keys=[prompt_key_id("template-a")])
    assert predictor.predict(request, 80).contribution[0] == 10.0


def test_oracle_returns_the_true_value():
    prediction = OraclePredictor().predict(active([0, 0, 0], remaining=[3, 81, 500]), 80)
    assert prediction.contribution.tolist() == [3.0, 81.0, 81.0]
    assert prediction.finish_probability.tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="remaining"):
        OraclePredictor().predict(active([0]), 80)


def test_roc_auc_by_hand():
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert roc_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5
    assert np.isnan(roc_auc(np.array([1, 1]), np.array([0.1, 0.2])))


def test_calibration_of_the_oracle_is_perfect_and_survival_is_informative():
    rng = np.random.default_rng(5)
    outputs = np.concatenate([np.full(400, 1024), rng.integers(1001, 1300, 600)])
    oracle = calibrate(OraclePredictor(), outputs, horizon=80)
    assert oracle.auc == 1.0 and oracle.mae_steps == 0.0
    survival = SurvivalPredictor()
    survival.observe_many(outputs)
    score = calibrate(survival, outputs, horizon=80)
    assert 0.9 < score.auc < 1.0
    assert 0.0 < score.mae_steps < 40.0
    assert score.samples == sum((o + 15) // 16 for o in outputs)
