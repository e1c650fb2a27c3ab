#!/usr/bin/env bash
# The speculative-core benchmark of docs/perf.md: ngram and self-int4 draft-model drafting vs plain decoding,
# fp32 and int4 (the int4 target has no self-int4 drafter: it would draft with itself), on MT-Bench and HumanEval.
set -euo pipefail
LIMIT=${LIMIT:-40}
for ds in mt-bench humaneval; do
  specrt bench smollm2-135m-instruct --dataset "$ds" --limit "$LIMIT" --max-new-tokens 128 \
    --precision fp32 --precision int4 --drafter ngram --drafter draft-model --json "docs/bench/$ds.json"
done
