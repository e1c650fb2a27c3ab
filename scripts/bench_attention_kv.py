"""Time ONNX Runtime's GroupQueryAttention for one decode token on the CPU with a float32 and a float16 KV cache.

    python scripts/bench_attention_kv.py [--past 64,1024] [--heads 9] [--kv-heads 3] [--head-dim 64] [--reps 30]

One attention layer (default: SmolLM2-135M's shape), its past and present bound to one buffer as the runtime binds
them (no copy of the cache per call), the two dtypes interleaved call by call; median microseconds per call. It
answers whether a float16 KV cache (what llama.cpp keeps) would halve attention's bytes at long contexts through
ONNX Runtime's own kernel.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def attention_session(dtype, past: int, heads: int, kv_heads: int, head_dim: int, max_len: int):
    """A one-node GroupQueryAttention session and a callable that runs one decode token at `past` cached."""
    t = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    shapes = {"q": [1, 1, heads * head_dim], "k": [1, 1, kv_heads * head_dim], "v": [1, 1, kv_heads * head_dim],
              "pk": [1, kv_heads, max_len, head_dim], "pv": [1, kv_heads, max_len, head_dim]}
    inputs = [helper.make_tensor_value_info(n, t, s) for n, s in shapes.items()]
    inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
               helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info(n, t, None) for n in ("out", "present_k", "present_v")]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total"],
                            ["out", "present_k", "present_v"], domain="com.microsoft", num_heads=heads,
                            kv_num_heads=kv_heads)
    model = helper.make_model(helper.make_graph([node], "attention", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    binding = session.io_binding()
    for name in ("q", "k", "v"):
        binding.bind_cpu_input(name, rng.random(shapes[name], dtype=np.float32).astype(dtype))
    binding.bind_cpu_input("seqlens_k", np.array([past], np.int32))
    binding.bind_cpu_input("total", np.array(past + 1, np.int32))
    for past_name, present_name in (("pk", "present_k"), ("pv", "present_v")):
        cache = ort.OrtValue.ortvalue_from_numpy(rng.random(shapes[past_name], dtype=np.float32).astype(dtype))
        binding.bind_ortvalue_input(past_name, cache)
        binding.bind_ortvalue_output(present_name, cache)  # one buffer: the runtime's in-place cache
    binding.bind_output("out")
    return lambda: session.run_with_iobinding(binding)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--past", default="64,1024")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    for past in (int(p) for p in args.past.split(",")):
        runs = {np.dtype(d).name: attention_session(d, past, args.heads, args.kv_heads, args.head_dim, 2 * past + 64)
                for d in (np.float32, np.float16)}
        times = {name: [] for name in runs}
        for _ in range(args.reps):
            for name, run in runs.items():
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
        cache_mb = 2 * args.kv_heads * past * args.head_dim * 4 / 1e6
        print(f"past {past}: " + ", ".join(f"{n} {1e6 * np.median(v):.0f} us" for n, v in times.items())
              + f" (float32 K and V read: {cache_mb:.2f} MB)")


if __name__ == "__main__":
    main()
