#!/usr/bin/env bash
# The default drafter (auto) against plain decoding, paired prompt by prompt in one run, beside the best single
# drafters, on general sets (MT-Bench, GSM8K) and a copy-heavy one (summaries) (docs/performance.md, "The adaptive
# draft length: the default never makes decoding slower"); results under OUT as auto-WHICH.*.
#   default: SmolLM2-135M-Instruct, int4 and fp32: auto, ngram, eagle3
#   int8:    SmolLM2-135M-Instruct, int8: auto, ngram
#   pair:    Qwen2.5-Coder-1.5B + its 0.5B draft model, int4: auto (= draft-model+ngram), ngram, draft-model
# usage: bash scripts/bench_auto.sh default|int8|pair [OUT]   (LIMIT, default 10 prompts per dataset)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac
WHICH=${1:?default, int8 or pair}
OUT=${2:-docs/bench}
LIMIT=${LIMIT:-10}
grep -o -E 'avx512[a-z_0-9]*|amx[a-z_0-9]*|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/auto-$WHICH.cpuflags"
SETS="--dataset mt-bench --dataset gsm8k --dataset summarize --limit $LIMIT --max-new-tokens 128"
if [ "$WHICH" = default ]; then
    specrt bench smollm2-135m-instruct --precision int4 --precision fp32 $SETS \
        --drafter auto --drafter ngram --drafter eagle3 \
        --json "$OUT/auto-default.json" --markdown "$OUT/auto-default.md"
elif [ "$WHICH" = int8 ]; then
    specrt bench smollm2-135m-instruct --precision int8 $SETS --drafter auto --drafter ngram \
        --json "$OUT/auto-int8.json" --markdown "$OUT/auto-int8.md"
else
    specrt bench qwen2.5-coder-1.5b-instruct --precision int4 $SETS \
        --drafter auto --drafter ngram --drafter draft-model \
        --json "$OUT/auto-pair.json" --markdown "$OUT/auto-pair.md"
fi
