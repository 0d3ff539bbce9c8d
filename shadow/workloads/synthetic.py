"""Synthetic workloads: named presets, deterministic per seed.

The public traces do not contain the paper's regime (long outputs near saturation: the
Azure 2024 slice has 11 requests over 1,000 output tokens), so presets generate it from
length distributions and Poisson arrivals. Arrival rates are only a base: replays re-time
them with `shadow.workloads.traces.retime(load=...)`.

Prompt keys (choice): public traces carry no usable prompt identity, but ExactMatch needs
recurring prompts to be worth anything, so a share of each preset's requests (30% for the
large presets) reuse one of a fixed set of *templates*. A template is one prompt (a fixed
prompt length and key) with its own typical output length drawn from the preset's output
distribution once; each of its requests varies a little around it (lognormal jitter), as
sampling varies the output of one prompt. Templates are equally popular by default
(`template_zipf = 0`): a skew lets a handful of templates move the preset means by several
percent from seed to seed. Template prompt and output lengths are stratified draws (one per
quantile band) for the same reason. The other requests carry `NO_KEY`, like the Azure
traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np

from shadow.policies.snapshot import NO_KEY, prompt_key_id
from shadow.replay.workload import Workload


class OutputLengths(Protocol):
    """An output length distribution, with per-template variation around a typical length."""

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray: ...

    def stratified(self, rng: np.random.Generator, size: int) -> np.ndarray: ...

    def around(self, rng: np.random.Generator, typical: np.ndarray) -> np.ndarray: ...


def _stratified_uniform(rng: np.random.Generator, size: int) -> np.ndarray:
    """One uniform draw per band [i/size, (i+1)/size), shuffled: a Latin-hypercube sample."""
    return rng.permutation((np.arange(size) + rng.random(size)) / size)


def _normal_ppf(u: np.ndarray) -> np.ndarray:
    """Inverse standard normal CDF, elementwise (few values: templates only)."""
    inv_cdf = NormalDist().inv_cdf
    return np.array([inv_cdf(float(x)) for x in u], dtype=np.float64)


@dataclass(frozen=True)
class LogNormalLengths:
    """Token counts `round(exp(N(mu, sigma)))` clipped to [low, high], `mu` set from the mean.

    `mean` is the mean before clipping; presets clip far enough out that it barely moves.
    """

    mean: float
    sigma: float
    low: int
    high: int
    jitter: float = 0.05

    @property
    def mu(self) -> float:
        return float(np.log(self.mean) - self.sigma**2 / 2)

    def _from_normal(self, z: np.ndarray) -> np.ndarray:
        values = np.rint(np.exp(self.mu + self.sigma * z))
        return np.clip(values, self.low, self.high).astype(np.int64)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._from_normal(rng.standard_normal(size))

    def stratified(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._from_normal(_normal_ppf(_stratified_uniform(rng, size)))

    def around(self, rng: np.random.Generator, typical: np.ndarray) -> np.ndarray:
        noise = np.exp(self.jitter * rng.standard_normal(typical.shape[0]))
        values = np.rint(typical * noise)
        return np.clip(values, self.low, self.high).astype(np.int64)


@dataclass(frozen=True)
class CappedLongOutputs:
    """Outputs over `floor`: a share exactly at `cap`, the rest `floor + Exp(tail_mean)`.

    Mirrors the long requests of the Azure 2024 conversation trace: over 1,000 tokens,
    clustered at exactly 1,024 (a `max_tokens` cap), the rest spread up to the trace's
    maximum of 1,500.
    """

    cap: int = 1024
    cap_share: float = 0.6
    floor: int = 1001
    tail_mean: float = 93.0
    high: int = 1500
    jitter: float = 0.02

    def _from_uniform(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        tail = self.floor + np.floor(-self.tail_mean * np.log1p(-v))
        values = np.where(u < self.cap_share, self.cap, np.minimum(tail, self.high))
        return values.astype(np.int64)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._from_uniform(rng.random(size), rng.random(size))

    def stratified(self, rng: np.random.Generator, size: int) -> np.ndarray:
        # Capped vs not is stratified; the tail given "not capped" too, independently.
        u = _stratified_uniform(rng, size)
        v = np.empty(size)
        tail = u >= self.cap_share
        v[tail] = _stratified_uniform(rng, int(tail.sum()))
        v[~tail] = rng.random(int((~tail).sum()))
        return self._from_uniform(u, v)

    def around(self, rng: np.random.Generator, typical: np.ndarray) -> np.ndarray:
        # A capped template stays at the cap; the others vary, staying over `floor`.
        noise = np.exp(self.jitter * rng.standard_normal(typical.shape[0]))
        varied = np.clip(np.rint(typical * noise), self.floor, self.high).astype(np.int64)
        return np.where(typical == self.cap, self.cap, varied)


@dataclass(frozen=True)
class Preset:
    """A named workload recipe: sizes, length distributions, arrival rate and templates."""

    name: str
    description: str
    requests: int
    rate_per_s: float
    prompts: LogNormalLengths
    outputs: OutputLengths
    template_share: float = 0.3
    templates: int = 200
    template_zipf: float = 0.0

    def generate(self, seed: int = 0, n: int | None = None) -> Workload:
        count = self.requests if n is None else n
        if count < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = np.random.default_rng(seed)
        ready = np.cumsum(rng.exponential(1.0 / self.rate_per_s, count))
        ready = ready - ready[0] if count else ready
        prompt = self.prompts.sample(rng, count)
        output = self.outputs.sample(rng, count)
        keys = np.full(count, NO_KEY, dtype=np.int64)
        if self.templates and self.template_share > 0 and count:
            uses = rng.random(count) < self.template_share
            popularity = 1.0 / np.arange(1, self.templates + 1) ** self.template_zipf
            which = rng.choice(
                self.templates, size=int(uses.sum()), p=popularity / popularity.sum()
            )
            template_prompt = self.prompts.stratified(rng, self.templates)
            template_output = self.outputs.stratified(rng, self.templates)
            template_key = np.array(
                [
                    prompt_key_id(f"synthetic:{self.name}:template:{t}")
                    for t in range(self.templates)
                ],
                dtype=np.int64,
            )
            prompt[uses] = template_prompt[which]
            output[uses] = self.outputs.around(rng, template_output[which])
            keys[uses] = template_key[which]
        return Workload.from_arrays(self.name, ready, prompt, output, keys)


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="paper-azure2024",
            description=(
                "the paper's Azure-2024 regime: 10,000 requests, outputs > 1,000 "
                "(mean ~1,052, ~60% at 1,024), prompts mean ~4,652"
            ),
            requests=10_000,
            # About load 1.0 for G = 8, B = 64 under the default StepModel.
            rate_per_s=8.0,
            prompts=LogNormalLengths(mean=4652, sigma=0.6, low=16, high=32768),
            outputs=CappedLongOutputs(),
        ),
        Preset(
            name="heavy-tail",
            description=(
                "5,000 requests with heavy-tailed outputs (median ~300, P99 ~5,000, cap "
                "16,384), prompts mean ~2,000"
            ),
            requests=5_000,
            rate_per_s=20.0,
            prompts=LogNormalLengths(mean=2000, sigma=0.8, low=16, high=32768),
            outputs=LogNormalLengths(mean=620, sigma=1.2, low=1, high=16384, jitter=0.1),
            templates=100,
        ),
        Preset(
            name="small",
            description="200 short requests (prompts ~300, outputs ~60) for tests and demos",
            requests=200,
            rate_per_s=20.0,
            prompts=LogNormalLengths(mean=300, sigma=0.5, low=8, high=2048),
            outputs=LogNormalLengths(mean=60, sigma=0.6, low=1, high=512, jitter=0.1),
            templates=10,
        ),
    )
}


def generate(preset_name: str, seed: int = 0, n: int | None = None) -> Workload:
    """Generate preset `preset_name` (deterministic per seed); `n` overrides its size."""
    preset = PRESETS.get(preset_name)
    if preset is None:
        raise ValueError(
            f"unknown synthetic preset {preset_name!r}; choose from {', '.join(PRESETS)}"
        )
    return preset.generate(seed=seed, n=n)
