#!/usr/bin/env bash
# The draft-model benchmark of docs/performance.md, "Speculative decoding by drafter and by family": ngram and
# self-int4 draft-model drafting vs plain decoding, fp32 and int4 (the int4 target has no self-int4 drafter: it
# would draft with itself), on MT-Bench and HumanEval; writes docs/bench/mt-bench.json and docs/bench/humaneval.json.
# usage: bash scripts/bench_draft_model.sh   (LIMIT, default 40 prompts per dataset)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac
LIMIT=${LIMIT:-40}
for ds in mt-bench humaneval; do
  specrt bench smollm2-135m-instruct --dataset "$ds" --limit "$LIMIT" --max-new-tokens 128 \
    --precision fp32 --precision int4 --drafter ngram --drafter draft-model --json "docs/bench/$ds.json"
done
