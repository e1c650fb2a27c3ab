"""Probe (issue 36): MatMulNBits speed by storage form, one token through a 1536 x 37,984 matrix (a quarter of the
Qwen2.5-1.5B lm_head) with random weights: 4 or 8 bits, blocks of 16 or 32, accuracy level 4, 2 threads.

    python scripts/matmulnbits_forms_probe.py
"""
import argparse
argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
import numpy as np, onnxruntime as ort, time
from onnx import helper as oh, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
K, N = 1536, 151936 // 4
def sess(bits, block):
    nb = K // block
    B = rng.integers(0, 256, (N, nb, block * bits // 8), dtype=np.uint8)
    S = (rng.random(N * nb) * 0.01).astype(np.float32)
    Z = np.full(N * (-(-nb * bits // 8)), 0x88 if bits == 4 else 128, np.uint8)
    g = oh.make_graph([oh.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["y"], domain="com.microsoft", K=K, N=N, bits=bits, block_size=block, accuracy_level=4)],
        "g", [oh.make_tensor_value_info("x", T.FLOAT, [None, K])], [oh.make_tensor_value_info("y", T.FLOAT, [None, N])],
        [nh.from_array(B, "B"), nh.from_array(S, "S"), nh.from_array(Z, "Z")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)], ir_version=9)
    so = ort.SessionOptions(); so.intra_op_num_threads = 2
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
x = rng.standard_normal((1, K)).astype(np.float32)
for bits, block in ((4, 32), (4, 16), (8, 32), (8, 16)):
    s = sess(bits, block)
    for _ in range(5): s.run(None, {"x": x})
    t = time.perf_counter(); n = 30
    for _ in range(n): s.run(None, {"x": x})
    ms = (time.perf_counter() - t) / n * 1000
    mb = N * K * (bits / 8 + 4 / block) / 1e6
    print(f"bits {bits} block {block}: {ms:.2f} ms, {mb:.0f} MB, {mb / ms:.1f} GB/s")
