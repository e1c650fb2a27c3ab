#!/usr/bin/env bash
# The EAGLE-3 benchmark of docs/perf.md: plain decoding vs the shipped head drafting a chain and an EAGLE-2
# tree, fp32 and int4, on MT-Bench, HumanEval and GSM8K (128 new tokens, greedy). The catalog bundles include
# the head (converted on first use). int4 runs twice on MT-Bench: as is (every system's default call shape)
# and batch-invariant (every call >= 2 rows: the mode in which int4 speculation equals plain decoding).
set -euo pipefail
LIMIT=${LIMIT:-20}
for ds in mt-bench humaneval gsm8k; do
  specrt bench smollm2-135m-instruct --dataset "$ds" --limit "$LIMIT" --max-new-tokens 128 \
    --precision fp32 --precision int4 --drafter eagle3 --drafter eagle3:tree --json "docs/bench/issue5-$ds.json" \
    --markdown "docs/bench/issue5-$ds.md" --plot "docs/bench/issue5-$ds.png"
done
specrt bench smollm2-135m-instruct --dataset mt-bench --limit "$LIMIT" --max-new-tokens 128 --precision int4 \
  --drafter eagle3 --drafter eagle3:tree --batch-invariant --json docs/bench/issue5-mt-bench-int4-invariant.json \
  --markdown docs/bench/issue5-mt-bench-int4-invariant.md
