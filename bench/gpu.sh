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
#   CARRY=/tmp/specrt-carry               where bench/carry.py receive left the carried wheels (onnxruntime-gpu):
#                                         installed from there into /tmp/site (no network on the GPU machine); this
#                                         checkout is installed offline (--no-deps) where specrt is not importable
#   FAMILIES=DIR                          tiny int4 GPU bundles of every family built here beforehand
#                                         (python bench/gpu_families.py build DIR): placement observed, plain and
#                                         speculative decoding, with SPECRT_NO_CPU_FALLBACK=1 (a node left to the CPU
#                                         fails its session). Built on the spot when unset (needs transformers).
# Degrades instead of stopping: without onnxruntime's GPU provider the Triton kernel tests and timings still run and
# the ONNX Runtime sections say why they are skipped. Prints Markdown tables; writes JSON beside them.
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

CARRY=${CARRY:-/tmp/specrt-carry}
if [ "$DEVICE" != cpu ] && ls "$CARRY"/*.whl > /dev/null 2>&1; then
    echo "== carried wheels from $CARRY: $(cd "$CARRY" && ls *.whl | tr '\n' ' ')"
    python -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$CARRY"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # ahead of the image's CPU onnxruntime
fi
if ! python -c "import specrt.convert" 2> /dev/null; then  # the GPU machine has no network: this checkout, offline
    python -m pip install -q --no-deps --no-build-isolation --no-index -e . > /dev/null
fi

echo "== machine"
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RESULTS/gpu.txt"
fi
grep -m1 -o 'avx512[a-z_]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' || true
echo
(DEVICE=$DEVICE python - <<'PY'
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
    print("bench/gpu.sh: missing: " + "; ".join(missing) + " (pip install 'specrt[nvidia]', or carry the wheel: "
          "bench/carry.py)")
    sys.exit(3 if any(m.startswith("onnxruntime") for m in missing) else 4)
if device == "cuda":
    ort.preload_dlls()  # the CUDA and cuDNN libraries torch's wheels bring
print("onnxruntime", ort.__version__, "| torch", torch.__version__, "| triton", triton.__version__)
PY
) && ORT_OK=1 || { status=$?; ORT_OK=0; [ "$status" = 3 ] || exit 1; }

echo "== kernel tests"
if [ "$DEVICE" = cpu ]; then
    python -m pytest -q tests/test_kernels.py -p no:cacheprovider | tail -3
else
    SPECRT_TEST_GPU=1 python -m pytest -q tests/test_kernels.py -p no:cacheprovider | tail -3
fi

if [ "$ORT_OK" = 1 ]; then
    echo "== every family's int4 GPU bundle: placement observed, plain and speculative"
    fam=${FAMILIES:-$WORK/families}
    [ -f "$fam/gemma4_text/specrt.json" ] || python bench/gpu_families.py build "$fam" > "$RESULTS/families-build.log" 2>&1 \
        || { tail -5 "$RESULTS/families-build.log"; exit 1; }
    python bench/gpu_families.py run "$fam" --device "$DEVICE" --json "$RESULTS/families.json" \
        | tee "$RESULTS/families.md"
else
    echo "== the ONNX Runtime sections are skipped: this onnxruntime has no GPU provider; the kernel timings follow"
fi

for size in $SIZES; do
    case $size in
        1b) preset=llama-3.2-1b ;;
        8b) preset=llama-3.1-8b ;;
        *) echo "bench/gpu.sh: unknown size $size (1b or 8b)" >&2; exit 2 ;;
    esac
    src=$WORK/$size
    bundle=$WORK/$size-$PRECISION
    if [ "$ORT_OK" != 1 ]; then
        echo "== $size: fused verification kernel (torch + triton only)"
        python bench/gpu_kernels.py --vocab 128256 --device "${DEVICE/rocm/cuda}" --json "$RESULTS/kernels-$size.json"
        continue
    fi
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
