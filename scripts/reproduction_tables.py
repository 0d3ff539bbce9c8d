"""Print the markdown tables of docs/REPRODUCTION.md from the JSON in docs/results/."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
BASELINES = ("random", "rr", "jsq", "p2c", "ltl", "vllm-dplb")


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def policy_table(name: str) -> str:
    report = load(name)
    policies = report["policies"]
    jsq = policies["jsq"]
    lines = [
        "| policy | imbalance | vs JSQ | gap I(k) | idle | tok/s | vs JSQ | TPOT P50 | TPOT P95 "
        "| TPOT P99 | pool wait P95 ms |",
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
    imb = policies["br0"]["imbalance_mean"] / policies["jsq"]["imbalance_mean"]
    workers = load(name)["workers"]
    return f"| {workers} | {best} | {base:,.0f} | {br0:+.1%} | {oracle:+.1%} | {imb:.2f}x |"


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


if __name__ == "__main__":
    main()
