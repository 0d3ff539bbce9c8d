"""Print the markdown tables of docs/REPRODUCTION.md from the JSON in docs/results/."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
#: the first round's baselines (all hold a pool)
BASELINES = ("random", "rr", "jsq-pool", "p2c", "ltl", "vllm-dplb-legacy")
#: the incumbents as they route, and the candidates beside them
INCUMBENT_ROWS = (
    "jsq", "ascend-proxy", "vllm-dplb", "vllm-dplb-legacy", "jsq-pool", "random",
    "br0-bypass", "br0", "brh-survival", "brh-oracle", "bf-io-h0", "bf-io",
)  # fmt: skip
HEAVY_TAIL = ("br0", "brh-survival", "brh-exactmatch", "brh-oracle", "jsq-pool")


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def reference(policies: dict) -> str:
    """JSQ as deployed (`jsq`) where the run has it, else the pooled JSQ."""
    return "jsq" if "jsq" in policies else "jsq-pool"


def policy_table(name: str) -> str:
    report = load(name)
    policies = report["policies"]
    base = reference(policies)
    jsq = policies[base]
    lines = [
        f"| policy | imbalance | vs {base} | gap I(k) | idle | tok/s | vs {base} | TPOT P50 "
        "| TPOT P95 | TPOT P99 | pool wait P95 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for policy, m in policies.items():
        lines.append(
            f"| {policy} | {m['imbalance_mean']:,.0f} "
            f"| {m['imbalance_mean'] / jsq['imbalance_mean']:.2f}x "
            f"| {m['gap_mean']:,.0f} | {m['idle_frac']:.1%} | {m['throughput_tok_s']:,.0f} "
            f"| {m['throughput_tok_s'] / jsq['throughput_tok_s']:.3f}x | {m['tpot_p50_ms']:.1f} "
            f"| {m['tpot_p95_ms']:.1f} | {m['tpot_p99_ms']:.1f} | {m['pool_wait_p95_ms']:,.0f} |"
        )
    return "\n".join(lines)


def gain_row(name: str) -> str:
    policies = load(name)["policies"]
    best = max(BASELINES, key=lambda p: policies[p]["throughput_tok_s"])
    base = policies[best]["throughput_tok_s"]
    br0 = policies["br0"]["throughput_tok_s"] / base - 1
    oracle = policies["brh-oracle"]["throughput_tok_s"] / base - 1
    imb = policies["br0"]["imbalance_mean"] / policies["jsq-pool"]["imbalance_mean"]
    workers = load(name)["workers"]
    return f"| {workers} | {best} | {base:,.0f} | {br0:+.1%} | {oracle:+.1%} | {imb:.2f}x |"


def incumbents_table(name: str) -> str:
    """The paper's columns (imbalance, TPOT P95, throughput), against JSQ as deployed."""
    policies = load(name)["policies"]
    jsq = policies["jsq"]
    lines = [
        "| policy | holds work | imbalance | vs jsq | TPOT P95 ms | tok/s | vs jsq "
        "| wait to start P95 s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    queued = {"jsq", "ascend-proxy", "vllm-dplb", "vllm-dplb-legacy", "br0-bypass"}
    for policy in INCUMBENT_ROWS:
        m = policies[policy]
        lines.append(
            f"| {policy} | {'worker queues' if policy in queued else 'pool'} "
            f"| {m['imbalance_mean']:,.0f} | {m['imbalance_mean'] / jsq['imbalance_mean']:.2f}x "
            f"| {m['tpot_p95_ms']:.1f} | {m['throughput_tok_s']:,.0f} "
            f"| {m['throughput_tok_s'] / jsq['throughput_tok_s']:.3f}x "
            f"| {m['pool_wait_p95_ms'] / 1000:,.1f} |"
        )
    return "\n".join(lines)


def incumbent_gain_row(name: str) -> str:
    """Gain of BR-0, BR-H oracle and BF-IO over the best router with worker queues."""
    report = load(name)
    policies = report["policies"]
    routers = ("jsq", "ascend-proxy", "vllm-dplb", "vllm-dplb-legacy")
    best = max(routers, key=lambda p: policies[p]["throughput_tok_s"])
    base = policies[best]["throughput_tok_s"]
    gains = [policies[p]["throughput_tok_s"] / base - 1 for p in ("br0", "brh-oracle", "bf-io")]
    imb = [
        policies[p]["imbalance_mean"] / policies["jsq"]["imbalance_mean"]
        for p in ("br0", "brh-oracle", "bf-io")
    ]
    return (
        f"| {report['workers']} | {best} | {base:,.0f} | "
        + " | ".join(f"{g:+.1%}" for g in gains)
        + " | "
        + " / ".join(f"{r:.2f}x" for r in imb)
        + " |"
    )


def heavy_tail_table() -> str:
    """Imbalance against `jsq` per seed of `heavy-tail` (G = 8, load 1.0), and the mean."""
    names = ["heavy-tail-load1.0"] + [f"heavy-tail-seed{s}-load1.0" for s in range(1, 6)]
    lines = [
        "| seed | jsq imbalance | " + " | ".join(HEAVY_TAIL) + " |",
        "| ---: | ---: |" + " ---: |" * len(HEAVY_TAIL),
    ]
    ratios: dict[str, list[float]] = {p: [] for p in HEAVY_TAIL}
    for seed, name in enumerate(names):
        policies = load(name)["policies"]
        jsq = policies["jsq"]["imbalance_mean"]
        cells = []
        for p in HEAVY_TAIL:
            ratios[p].append(policies[p]["imbalance_mean"] / jsq)
            cells.append(f"{ratios[p][-1]:.2f}x")
        lines.append(f"| {seed} | {jsq:,.0f} | " + " | ".join(cells) + " |")
    means = [f"{sum(v) / len(v):.2f}x" for v in ratios.values()]
    lines.append("| mean | | " + " | ".join(means) + " |")
    return "\n".join(lines)


def main() -> None:
    for name in sorted(p.stem for p in RESULTS.glob("*.json")):
        report = load(name)
        if "schema" not in report:  # benchmark output, not a replay report
            continue
        print(
            f"### {name}\n\n`{report['trace']}`, {report['requests']:,} requests, "
            f"G = {report['workers']}, B = {report['batch']}\n"
        )
        print(policy_table(name) + "\n")
    print(
        "### scaling\n\n| G | best baseline | its tok/s | BR-0 gain | BR-H oracle gain "
        "| BR-0 imbalance vs JSQ |\n| ---: | --- | ---: | ---: | ---: | ---: |"
    )
    for g in (4, 8, 16):
        print(gain_row(f"paper-g{g}-load1.0"))
    for g in (4, 8, 16):
        print(f"\n### incumbents as they route, G = {g}\n")
        print(incumbents_table(f"incumbents-g{g}-load1.0"))
    print(
        "\n### gain over the best router with worker queues\n\n| G | best router | its tok/s "
        "| BR-0 | BR-H oracle | BF-IO | imbalance vs jsq (BR-0 / oracle / BF-IO) |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |"
    )
    for g in (4, 8, 16):
        print(incumbent_gain_row(f"incumbents-g{g}-load1.0"))
    print("\n### heavy-tail, G = 8, load 1.0, by seed\n")
    print(heavy_tail_table())


if __name__ == "__main__":
    main()
