#!/usr/bin/env bash
# specrt on a GPU in one prepared run that carries no weights: it writes synthetic models on the machine itself
# (scripts/synthetic_model.py: a 1B-class Llama-3.2 shape and the Llama-3.1-8B shape, random bf16 weights, each
# with an EAGLE-3 head), converts them to fp16 bundles on the device, runs the kernel tests natively, times
# the fused verification kernel against the bytes it reads, and measures step costs (bench/gpu_steps.py):
# verify(k) / verify(1) for k = 1..16 at a cache of 512, the head's call, and plain against speculative
# decoding at fixed draft lengths, whose outputs must be equal. Random weights accept nothing: the step costs
# are the result.
#
# Usage: bash bench/gpu.sh [OUT_DIR]      (default ./gpu-results, or $OUT when set, as on specrt's device machine)
#   DEVICE=cuda (default) | rocm | cpu    cpu: the end-to-end check of this script on a machine without a GPU
#                                         (Triton's interpreter, test-size twins of the shapes, fp32)
#   SIZES="1b 8b" (default)               which shapes (8b needs ~16 GB of disk for its source, ~16 GB for fp16)
#   REPS=10 NEW=1,2,3,4,6,8,12,16         timing repetitions and new-token counts
# Needs specrt installed with the GPU extra (onnxruntime-gpu, torch with CUDA, triton) in the Python on PATH;
# says what is missing and stops. Prints Markdown tables; writes JSON beside them.
set -euo pipefail
RESULTS=${1:-${OUT:-gpu-results}}
DEVICE=${DEVICE:-cuda}
SIZES=${SIZES:-1b 8b}
REPS=${REPS:-10}
NEW=${NEW:-1,2,3,4,6,8,12,16}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
cd "$(dirname "$0")/.."
WORK=${WORK:-$RESULTS/models}
TIMER=()
if [ -x /usr/bin/time ]; then TIMER=(/usr/bin/time -v); fi

if [ "$DEVICE" = cpu ]; then
    export TRITON_INTERPRET=1
    PRECISION=fp32
    SHAPE_ARGS=(--tiny --layers 2)
    REPS=2
else
    PRECISION=fp16
    SHAPE_ARGS=()
fi

echo "== machine"
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RESULTS/gpu.txt"
fi
grep -m1 -o 'avx512[a-z_]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' || true
echo
DEVICE=$DEVICE python - <<'PY'
import os, sys
device = os.environ["DEVICE"]
missing = []
try:
    import onnxruntime as ort
    want = {"cuda": "CUDAExecutionProvider", "rocm": "MIGraphXExecutionProvider"}.get(device)
    if want and want not in ort.get_available_providers():
        missing.append(f"onnxruntime {ort.__version__} has no {want}")
except ImportError:
    missing.append("onnxruntime")
try:
    import torch
    if device != "cpu" and not torch.cuda.is_available():
        missing.append(f"torch {torch.__version__} sees no GPU")
except ImportError:
    missing.append("torch")
try:
    import triton  # noqa: F401
except ImportError:
    missing.append("triton")
if missing:
    sys.exit("bench/gpu.sh: missing: " + "; ".join(missing) + " (pip install 'specrt[nvidia]')")
print("onnxruntime", ort.__version__, "| torch", torch.__version__, "| triton", triton.__version__)
PY

echo "== kernel tests"
if [ "$DEVICE" = cpu ]; then
    python -m pytest -q tests/test_kernels.py -p no:cacheprovider | tail -3
else
    SPECRT_TEST_GPU=1 python -m pytest -q tests/test_kernels.py -p no:cacheprovider | tail -3
fi

for size in $SIZES; do
    case $size in
        1b) preset=llama-3.2-1b ;;
        8b) preset=llama-3.1-8b ;;
        *) echo "bench/gpu.sh: unknown size $size (1b or 8b)" >&2; exit 2 ;;
    esac
    src=$WORK/$size
    bundle=$WORK/$size-$PRECISION
    echo "== $preset: synthetic source, then the $PRECISION bundle"
    if [ ! -d "$src/target" ]; then
        python scripts/synthetic_model.py "$preset" "$src" "${SHAPE_ARGS[@]}"
    fi
    if [ ! -f "$bundle/specrt.json" ]; then
        "${TIMER[@]}" specrt convert "$src/target" -o "$bundle" --precision "$PRECISION" --device "$DEVICE" \
            --max-context 1024 --drafter "eagle3:$src/eagle3" 2> "$RESULTS/convert-$size.time" \
            || { tail -20 "$RESULTS/convert-$size.time"; exit 1; }
        grep -E "Maximum resident|Elapsed|converted" "$RESULTS/convert-$size.time" || true
    fi
    vocab=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$bundle/specrt.json")

    echo "== $size: fused verification kernel against the bytes it reads"
    if [ "$DEVICE" = cpu ]; then
        python bench/gpu_kernels.py --vocab "$vocab" --device cpu --iters 2 --json "$RESULTS/kernels-$size.json"
    else
        python bench/gpu_kernels.py --vocab "$vocab" --device cuda --json "$RESULTS/kernels-$size.json"
    fi

    echo "== $size: step costs and fixed-length decoding"
    python bench/gpu_steps.py "$bundle" --device "$DEVICE" --drafter eagle3 --past 512 --new "$NEW" \
        --reps "$REPS" --json "$RESULTS/steps-$size.json" | tee "$RESULTS/steps-$size.md"
done
echo "== results in $RESULTS"
