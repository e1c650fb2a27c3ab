"""Probe (issue 35): QMoE in one batched call vs one call per token inside a Scan, on random int4 experts of
Qwen3-30B-A3B's widths (32 of its 128 experts, top-8): is a token's output independent of its call, and what each
costs for 1, 2, 4, 8 tokens.    python scripts/qmoe_scan_probe.py"""
import argparse
argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
import numpy as np
import onnxruntime as ort
from onnx import helper as oh, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
E, K, H, I, B = 32, 8, 2048, 768, 32
def q4(n, k):  # random packed int4, scales, zero points
    return (rng.integers(0, 256, (E, n, k // 2), dtype=np.uint8), (rng.random((E, n, k // B)) * 0.02).astype(np.float32),
            rng.integers(0, 256, (E, n, k // B // 2), dtype=np.uint8))
w1, s1, z1 = q4(2 * I, H); w2, s2, z2 = q4(H, I)
inits = [nh.from_array(a, n) for a, n in ((w1, "w1"), (s1, "s1"), (z1, "z1"), (w2, "w2"), (s2, "s2"), (z2, "z2"))]
attrs = dict(k=K, activation_type="swiglu", swiglu_fusion=1, expert_weight_bits=4, block_size=B, accuracy_level=4,
             normalize_routing_weights=1, weights_prepacked=0)
def qmoe(x, r, out):
    return oh.make_node("QMoE", [x, r, "w1", "s1", "", "w2", "s2", "", "", "", "", "z1", "z2"], [out], domain="com.microsoft", **attrs)
# batched graph
g1 = oh.make_graph([qmoe("x", "r", "y")], "batched", [oh.make_tensor_value_info("x", T.FLOAT, ["N", H]),
     oh.make_tensor_value_info("r", T.FLOAT, ["N", E])], [oh.make_tensor_value_info("y", T.FLOAT, ["N", H])], inits)
# per-token Scan graph
body = oh.make_graph([
    oh.make_node("Unsqueeze", ["xi", "ax"], ["x1"]), oh.make_node("Unsqueeze", ["ri", "ax"], ["r1"]),
    qmoe("x1", "r1", "y1"), oh.make_node("Squeeze", ["y1", "ax"], ["yi"])], "body",
    [oh.make_tensor_value_info("xi", T.FLOAT, [H]), oh.make_tensor_value_info("ri", T.FLOAT, [E])],
    [oh.make_tensor_value_info("yi", T.FLOAT, [H])], [nh.from_array(np.array([0], np.int64), "ax")])
scan = oh.make_node("Scan", ["x", "r"], ["y"], num_scan_inputs=2, body=body)
g2 = oh.make_graph([scan], "scan", [oh.make_tensor_value_info("x", T.FLOAT, ["N", H]),
     oh.make_tensor_value_info("r", T.FLOAT, ["N", E])], [oh.make_tensor_value_info("y", T.FLOAT, ["N", H])], inits)
opset = [oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)]
so = ort.SessionOptions(); so.log_severity_level = 3
sess = {n: ort.InferenceSession(oh.make_model(g, opset_imports=opset, ir_version=9).SerializeToString(), so,
                                providers=["CPUExecutionProvider"]) for n, g in (("batched", g1), ("scan", g2))}
x = rng.standard_normal((10, H)).astype(np.float32); r = rng.standard_normal((10, E)).astype(np.float32) * 3
for n, s in sess.items():
    whole = s.run(None, {"x": x, "r": r})[0]
    alone = np.concatenate([s.run(None, {"x": x[i:i + 1], "r": r[i:i + 1]})[0] for i in range(10)])
    print(f"{n}: whole vs one at a time max|diff| = {np.abs(whole - alone).max():.3e}, bitwise equal {np.array_equal(whole, alone)}")
print("scan vs batched (one at a time):", np.abs(sess['scan'].run(None, {'x': x, 'r': r})[0] - np.concatenate([sess['batched'].run(None, {'x': x[i:i+1], 'r': r[i:i+1]})[0] for i in range(10)])).max())
import time
for n, s in sess.items():
    for S in (1, 2, 4, 8):
        t = time.perf_counter()
        for _ in range(20): s.run(None, {"x": x[:S], "r": r[:S]})
        print(n, S, f"{(time.perf_counter() - t) / 20 * 1000:.2f} ms")
