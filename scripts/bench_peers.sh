#!/usr/bin/env bash
# specrt beside the peers, each on the same weights, interleaved prompt by prompt (docs/performance.md: "Plain
# decoding on the CPU against llama.cpp and others", "Qwen2.5-Coder-1.5B with its 0.5B sibling" and, for int8,
# "Precision: fp32, int8, int4 and GGUF-exact weights"); results under OUT as peers-WHICH.*.
#   default: SmolLM2-135M-Instruct, int4 and fp32, MT-Bench / HumanEval / GSM8K, with OpenVINO GenAI (plain, prompt
#            lookup, EAGLE-3), onnxruntime-genai (plain, n-gram) and llama.cpp (plain, prompt lookup)
#   pair:    Qwen2.5-Coder-1.5B + 0.5B draft model, int4, MT-Bench / HumanEval, with each peer's speculative rows
#   int8:    SmolLM2-135M-Instruct, int8 beside fp32 and int4, the same three sets, with OpenVINO GenAI (its int8
#            export, and fp32 strict f32 and at its default hint: bf16 compute on a CPU with bf16)
# usage: bash scripts/bench_peers.sh default|pair|int8 [OUT]   (LIMIT, default 8 prompts per dataset)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac
WHICH=${1:?default, pair or int8}
OUT=${2:-docs/bench}
LIMIT=${LIMIT:-8}
grep -o -E 'avx512[a-z_0-9]*|amx[a-z_0-9]*|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/peers-$WHICH.cpuflags"
COMPARE="--compare openvino --compare onnxruntime-genai --compare llama.cpp"
if [ "$WHICH" = default ]; then
    specrt bench smollm2-135m-instruct --precision int4 --precision fp32 \
        --dataset mt-bench --dataset humaneval --dataset gsm8k --limit "$LIMIT" --max-new-tokens 128 \
        --drafter eagle3 --drafter dflash --drafter ngram $COMPARE \
        --json "$OUT/peers-default.json" --markdown "$OUT/peers-default.md" --plot "$OUT/peers-default.png"
elif [ "$WHICH" = int8 ]; then
    specrt bench smollm2-135m-instruct --precision int8 --precision fp32 --precision int4 \
        --dataset mt-bench --dataset humaneval --dataset gsm8k --limit "$LIMIT" --max-new-tokens 128 \
        --drafter eagle3 --drafter ngram --compare openvino \
        --json "$OUT/peers-int8.json" --markdown "$OUT/peers-int8.md" --plot "$OUT/peers-int8.png"
else
    specrt bench qwen2.5-coder-1.5b-instruct --precision int4 --dataset mt-bench --dataset humaneval \
        --limit "$LIMIT" --max-new-tokens 128 \
        --drafter draft-model --drafter ngram --drafter draft-model+ngram \
        --drafter ngram:history --drafter draft-model+ngram:history $COMPARE \
        --json "$OUT/peers-pair.json" --markdown "$OUT/peers-pair.md" --plot "$OUT/peers-pair.png"
fi
