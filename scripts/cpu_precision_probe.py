"""What ONNX Runtime's CPU provider offers between fp32 and int4 weights, on this machine: the same chain of
matmuls (LAYERS x [576 -> 1536 -> 576], SmolLM2-135M's MLP widths, random weights) as fp32 MatMul, fp16 MatMul,
bf16 MatMul, and MatMulNBits with 8-bit and 4-bit weights (blocks of 32, int8 activations: accuracy level 4, as
specrt's int4 graphs use), one token and four tokens per call, interleaved. A variant ONNX Runtime cannot run is
reported with its error. Prints a markdown table of median milliseconds and the CPU flags.
Usage: python scripts/cpu_precision_probe.py [--layers 30] [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

H, F = 576, 1536


def _linear_float(name: str, x: str, k: int, n: int, dtype, rng) -> tuple[list, list]:
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if dtype == TensorProto.FLOAT16:
        init = numpy_helper.from_array(w.astype(np.float16), f"{name}.w")
    elif dtype == TensorProto.BFLOAT16:
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)
        init = helper.make_tensor(f"{name}.w", TensorProto.BFLOAT16, (k, n), bits.tobytes(), raw=True)
    else:
        init = numpy_helper.from_array(w, f"{name}.w")
    return [helper.make_node("MatMul", [x, f"{name}.w"], [f"{name}.y"], name=name)], [init]


def _linear_nbits(name: str, x: str, k: int, n: int, bits: int, rng) -> tuple[list, list]:
    block = 32
    blocks = k // block
    blob = block * bits // 8
    q = numpy_helper.from_array(rng.integers(0, 256, (n, blocks, blob), dtype=np.uint8), f"{name}.q")
    s = numpy_helper.from_array((rng.random(n * blocks).astype(np.float32) + 0.5) / 64, f"{name}.s")
    node = helper.make_node("MatMulNBits", [x, f"{name}.q", f"{name}.s"], [f"{name}.y"], name=name,
                            domain="com.microsoft", K=k, N=n, bits=bits, block_size=block, accuracy_level=4)
    return [node], [q, s]


def build(variant: str, layers: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    dtype = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}.get(variant, TensorProto.FLOAT)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        for j, (k, n) in enumerate(((H, F), (F, H))):
            name = f"l{i}_{j}"
            if variant.startswith("int"):
                new, w = _linear_nbits(name, x, k, n, int(variant[3:]), rng)
            else:
                new, w = _linear_float(name, x, k, n, dtype, rng)
            nodes += new
            inits += w
            x = f"{name}.y"
    graph = helper.make_graph(nodes, variant, [helper.make_tensor_value_info("x", dtype, ["m", H])],
                              [helper.make_tensor_value_info(x, dtype, ["m", H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    variants = ["fp32", "fp16", "bf16", "int8", "int4"]
    sessions, errors = {}, {}
    for v in variants:
        try:
            opts = ort.SessionOptions()
            opts.add_session_config_entry("session.force_spinning_stop", "1")
            sessions[v] = ort.InferenceSession(build(v, args.layers), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - reported
            errors[v] = str(exc).strip().splitlines()[0][:160]
    times = {(v, m): [] for v in sessions for m in (1, 4)}
    for _ in range(3):
        for m in (1, 4):
            for v, sess in sessions.items():
                dtype = {"fp16": np.float16}.get(v, np.float32)
                feed = np.random.default_rng(1).standard_normal((m, H)).astype(dtype)
                if v == "bf16":
                    feed = None
                    inp = sess.get_inputs()[0]
                    try:
                        arr = np.zeros((m, H), dtype=np.uint16)
                        feed = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, TensorProto.BFLOAT16)
                    except Exception as exc:  # noqa: BLE001
                        errors[v] = str(exc).splitlines()[0][:160]
                        continue
                    run = lambda: sess.run_with_ort_values(None, {inp.name: feed})  # noqa: E731
                else:
                    run = lambda: sess.run(None, {"x": feed})  # noqa: E731
                try:
                    run()
                except Exception as exc:  # noqa: BLE001
                    errors[v] = str(exc).strip().splitlines()[0][:160]
                    continue
                for _ in range(args.reps):
                    t = time.perf_counter()
                    run()
                    times[(v, m)].append((time.perf_counter() - t) * 1000)
    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags") for f in line.split()
                    if f.startswith(("avx512", "amx", "avx2"))})
    print(f"CPU flags: {' '.join(flags)}; onnxruntime {ort.__version__}; {args.layers} x [{H}->{F}->{H}]")
    print("| weights | 1 token (ms) | 4 tokens (ms) | vs fp32, 1 token |\n|---|---|---|---|")
    base = statistics.median(times[("fp32", 1)]) if times.get(("fp32", 1)) else float("nan")
    for v in variants:
        if v in errors or not times.get((v, 1)):
            print(f"| {v} | not run: {errors.get(v, 'no timing')} | | |")
            continue
        one, four = statistics.median(times[(v, 1)]), statistics.median(times[(v, 4)])
        print(f"| {v} | {one:.2f} | {four:.2f} | {base / one:.2f}x |")


if __name__ == "__main__":
    main()
