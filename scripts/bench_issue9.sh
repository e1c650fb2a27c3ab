#!/usr/bin/env bash
# Issue 9: Qwen2.5-Coder-1.5B-Instruct (int4) with its 0.5B sibling as draft model, from the catalog: plain,
# draft-model, ngram and their adaptive mix beside llama.cpp (the same GGUF) and onnxruntime-genai int4.
set -euo pipefail
OUT=${1:-docs/bench}
LIMIT=${LIMIT:-8}
NAME=${NAME:-issue9-b128}  # issue9: the first run, at int4 blocks of 32
M=qwen2.5-coder-1.5b-instruct
specrt bench $M --dataset humaneval --dataset mt-bench --limit $LIMIT --max-new-tokens 128 \
    --drafter draft-model --drafter ngram --drafter draft-model+ngram \
    --compare llama.cpp --compare onnxruntime-genai \
    --json $OUT/$NAME.json --markdown $OUT/$NAME.md --plot $OUT/$NAME.png
