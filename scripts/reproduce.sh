#!/usr/bin/env bash
# Runs every replay behind docs/REPRODUCTION.md and writes its JSON to docs/results/.
# Then: .venv/bin/python scripts/reproduction_tables.py  (prints the markdown tables)
set -euo pipefail
cd "$(dirname "$0")/.."
shadow=.venv/bin/shadow
out=docs/results
data=../shared/data
mkdir -p "$out"
run() { local name=$1; shift; echo "== $name: shadow replay $*"; "$shadow" replay "$@" --no-db --json "$out/$name.json" >/dev/null; }

# The first round's ten policies: every router holds a pool (`jsq-pool` was then `jsq`,
# `vllm-dplb-legacy` was then `vllm-dplb`).
first=random,rr,jsq-pool,p2c,ltl,vllm-dplb-legacy,br0,brh-survival,brh-exactmatch,brh-oracle
for load in 0.8 0.9 1.0 1.1; do
  run "paper-g8-load$load" synthetic:paper-azure2024 --workers 8 --load "$load" --policies "$first"
done
for g in 4 16; do
  run "paper-g$g-load1.0" synthetic:paper-azure2024 --workers "$g" --load 1.0 --policies "$first"
done
run azure2024-slice-asis "$data/azure-2024-conv/AzureLLMInferenceTrace_conv_1week.slice_2024-05-12T0100-0103.csv" --workers 8 --policies "$first"
run azure2024-slice-load1.0 "$data/azure-2024-conv/AzureLLMInferenceTrace_conv_1week.slice_2024-05-12T0100-0103.csv" --workers 8 --load 1.0 --policies "$first"
run mooncake-load1.0 "$data/mooncake-fast25/synthetic_trace.jsonl" --workers 8 --load 1.0 --policies "$first"

# Incumbents as they route (worker queues) against BR-0, BR-H and BF-IO.
incumbents=random,jsq,jsq-pool,ascend-proxy,vllm-dplb,vllm-dplb-legacy,br0-bypass,br0,brh-survival,brh-oracle,bf-io-h0,bf-io
for g in 4 8 16; do
  run "incumbents-g$g-load1.0" synthetic:paper-azure2024 --workers "$g" --load 1.0 --policies "$incumbents"
done

# Heavy tails: BR-H with the oracle against BR-H with predictors, seeds 0-5.
heavy=jsq,jsq-pool,br0,brh-survival,brh-exactmatch,brh-oracle
run heavy-tail-load1.0 synthetic:heavy-tail --workers 8 --load 1.0 --policies "$heavy"
for seed in 1 2 3 4 5; do
  run "heavy-tail-seed$seed-load1.0" synthetic:heavy-tail --seed "$seed" --workers 8 --load 1.0 --policies "$heavy"
done
