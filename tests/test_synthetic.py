import numpy as np
import pytest

from shadow.policies.snapshot import NO_KEY
from shadow.workloads.synthetic import PRESETS, generate

SEEDS = range(5)


def _within(value: float, target: float, tolerance: float) -> bool:
    return abs(value - target) <= tolerance * target


def test_presets_have_sizes_and_one_line_descriptions():
    assert set(PRESETS) >= {"paper-azure2024", "heavy-tail", "small"}
    sizes = {"paper-azure2024": 10_000, "heavy-tail": 5_000, "small": 200}
    for name, preset in PRESETS.items():
        assert preset.description and "\n" not in preset.description
        workload = generate(name)
        assert len(workload) == sizes.get(name, preset.requests)
        assert workload.name == name
        assert workload.ready_s[0] == 0.0
        assert np.all(np.diff(workload.ready_s) >= 0)
        assert workload.output_tokens.min() >= 1


@pytest.mark.parametrize("seed", SEEDS)
def test_paper_azure2024_hits_the_paper_means(seed):
    workload = generate("paper-azure2024", seed=seed)
    prompt, output = workload.prompt_tokens, workload.output_tokens
    assert _within(prompt.mean(), 4652, 0.02)
    assert prompt.min() >= 16 and prompt.max() <= 32768
    assert _within(output.mean(), 1052, 0.01)
    assert output.min() > 1000 and output.max() <= 1500
    assert 0.55 <= np.mean(output == 1024) <= 0.65
    keyed = workload.prompt_keys != NO_KEY
    assert 0.27 <= keyed.mean() <= 0.33
    assert len(np.unique(workload.prompt_keys[keyed])) == 200
    # Poisson arrivals at the base rate of 8 requests/s.
    assert _within((len(workload) - 1) / workload.ready_s[-1], 8.0, 0.05)


def test_paper_azure2024_templates_are_learnable():
    workload = generate("paper-azure2024")
    keys = workload.prompt_keys
    spreads = []
    for key in np.unique(keys[keys != NO_KEY]):
        mine = keys == key
        assert len(np.unique(workload.prompt_tokens[mine])) == 1  # one prompt per template
        spreads.append(workload.output_tokens[mine].std())
    # Within a template outputs vary far less than across the whole workload.
    assert np.mean(spreads) < 0.5 * workload.output_tokens.std()


@pytest.mark.parametrize("seed", SEEDS)
def test_heavy_tail_has_a_heavy_tail(seed):
    workload = generate("heavy-tail", seed=seed)
    output = workload.output_tokens
    assert 200 <= np.median(output) <= 450
    assert 3000 <= np.percentile(output, 99) <= 8000
    assert output.max() <= 16384
    assert _within(output.mean(), 620, 0.10)
    assert _within(workload.prompt_tokens.mean(), 2000, 0.05)


@pytest.mark.parametrize("seed", SEEDS)
def test_small_is_short(seed):
    workload = generate("small", seed=seed)
    assert _within(workload.prompt_tokens.mean(), 300, 0.15)
    assert _within(workload.output_tokens.mean(), 60, 0.20)
    assert workload.output_tokens.max() <= 512


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_generation_is_deterministic_per_seed_and_differs_across_seeds(name):
    first, again, other = generate(name, seed=7), generate(name, seed=7), generate(name, seed=8)
    for field in ("ready_s", "prompt_tokens", "output_tokens", "prompt_keys"):
        assert np.array_equal(getattr(first, field), getattr(again, field))
    assert not np.array_equal(first.prompt_tokens, other.prompt_tokens)
    assert not np.array_equal(first.ready_s, other.ready_s)


def test_n_overrides_the_size_and_unknown_presets_are_listed():
    assert len(generate("small", n=17)) == 17
    assert len(generate("small", n=0)) == 0
    with pytest.raises(ValueError, match="choose from paper-azure2024, heavy-tail, small"):
        generate("medium")
