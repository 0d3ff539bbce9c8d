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

for load in 0.8 0.9 1.0 1.1; do
  run "paper-g8-load$load" synthetic:paper-azure2024 --workers 8 --load "$load"
done
for g in 4 16; do
  run "paper-g$g-load1.0" synthetic:paper-azure2024 --workers "$g" --load 1.0
done
run azure2024-slice-asis "$data/azure-2024-conv/AzureLLMInferenceTrace_conv_1week.slice_2024-05-12T0100-0103.csv" --workers 8
run azure2024-slice-load1.0 "$data/azure-2024-conv/AzureLLMInferenceTrace_conv_1week.slice_2024-05-12T0100-0103.csv" --workers 8 --load 1.0
run mooncake-load1.0 "$data/mooncake-fast25/synthetic_trace.jsonl" --workers 8 --load 1.0
