"""Probe (issue 35): graph forms that can run QMoE one token at a time on request, at one Qwen3-30B-A3B-width layer
(128 random int4 experts, top-8, block 32): session memory, per-token exactness, ms for 1/2/4/8 tokens.

    python scripts/qmoe_exact_forms_probe.py plain|if|chunk

plain: the batched op (the flag ignored); if: If(flag){Scan with one op call per token}else{batched op} (two op
nodes); chunk: one op inside a Scan whose chunk is one token (flag) or the whole call (what convert writes)."""
import argparse
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("form", choices=("plain", "if", "chunk"))
form = ap.parse_args().form
import time, psutil
import numpy as np
import onnxruntime as ort
from onnx import helper as oh, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
E, K, H, I, B = 128, 8, 2048, 768, 32
def q4(n, k):
    return (rng.integers(0, 256, (E, n, k // 2), dtype=np.uint8), (rng.random((E, n, k // B)) * 0.02).astype(np.float32),
            rng.integers(0, 256, (E, n, k // B // 2), dtype=np.uint8))
w1, s1, z1 = q4(2 * I, H); w2, s2, z2 = q4(H, I)
inits = [nh.from_array(a, n) for a, n in ((w1, "w1"), (s1, "s1"), (z1, "z1"), (w2, "w2"), (s2, "s2"), (z2, "z2"))]
inits.append(nh.from_array(np.array([0], np.int64), "ax"))
attrs = dict(k=K, activation_type="swiglu", swiglu_fusion=1, expert_weight_bits=4, block_size=B, accuracy_level=4,
             normalize_routing_weights=1, weights_prepacked=0)
def qmoe(x, r, out):
    return oh.make_node("QMoE", [x, r, "w1", "s1", "", "w2", "s2", "", "", "", "", "z1", "z2"], [out], domain="com.microsoft", **attrs)
vi = oh.make_tensor_value_info
ins = [vi("x", T.FLOAT, ["N", H]), vi("r", T.FLOAT, ["N", E]), vi("flag", T.BOOL, [])]
outs = [vi("y", T.FLOAT, ["N", H])]
def scan_body(chunked):
    if chunked:  # xi [M, H]
        return oh.make_graph([qmoe("xi", "ri", "yi")], "body", [vi("xi", T.FLOAT, ["M", H]), vi("ri", T.FLOAT, ["M", E])], [vi("yi", T.FLOAT, ["M", H])])
    return oh.make_graph([oh.make_node("Unsqueeze", ["xi", "ax"], ["x1"]), oh.make_node("Unsqueeze", ["ri", "ax"], ["r1"]),
        qmoe("x1", "r1", "y1"), oh.make_node("Squeeze", ["y1", "ax"], ["yi"])], "body",
        [vi("xi", T.FLOAT, [H]), vi("ri", T.FLOAT, [E])], [vi("yi", T.FLOAT, [H])])
if form == "plain":
    nodes = [qmoe("x", "r", "y"), oh.make_node("Identity", ["flag"], ["f2"])]
    outs.append(vi("f2", T.BOOL, []))
elif form == "if":
    then_g = oh.make_graph([oh.make_node("Scan", ["x", "r"], ["ys"], num_scan_inputs=2, body=scan_body(False))], "then", [], [vi("ys", T.FLOAT, ["N", H])])
    else_g = oh.make_graph([qmoe("x", "r", "yb")], "else", [], [vi("yb", T.FLOAT, ["N", H])])
    nodes = [oh.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g)]
else:  # chunk: M = 1 if flag else N
    inits += [nh.from_array(np.array([1], np.int64), "one"), nh.from_array(np.array([-1], np.int64), "m1"),
              nh.from_array(np.array([H], np.int64), "hH"), nh.from_array(np.array([E], np.int64), "hE"),
              nh.from_array(np.array([0], np.int64), "zero")]
    nodes = [oh.make_node("Shape", ["x"], ["sx"]), oh.make_node("Gather", ["sx", "zero"], ["n"], axis=0),
             oh.make_node("Where", ["flag", "one", "n"], ["m"]),
             oh.make_node("Concat", ["m1", "m", "hH"], ["shx"], axis=0), oh.make_node("Concat", ["m1", "m", "hE"], ["shr"], axis=0),
             oh.make_node("Reshape", ["x", "shx"], ["xc"]), oh.make_node("Reshape", ["r", "shr"], ["rc"]),
             oh.make_node("Scan", ["xc", "rc"], ["yc"], num_scan_inputs=2, body=scan_body(True)),
             oh.make_node("Concat", ["m1", "hH"], ["shy"], axis=0), oh.make_node("Reshape", ["yc", "shy"], ["y"])]
g = oh.make_graph(nodes, form, ins, outs, inits)
opset = [oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)]
so = ort.SessionOptions(); so.log_severity_level = 3; so.intra_op_num_threads = 2
data = oh.make_model(g, opset_imports=opset, ir_version=9).SerializeToString()
del inits, w1, w2
proc = psutil.Process()
before = proc.memory_info().rss
s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
del data
x = rng.standard_normal((10, H)).astype(np.float32); r = rng.standard_normal((10, E)).astype(np.float32) * 3
def run(S, f):
    return s.run(["y"], {"x": x[:S], "r": r[:S], "flag": np.array(f)})[0]
for f in (False, True):
    run(4, f)
print(form, "rss MiB", proc.memory_info().rss / 2**20, "session +", (proc.memory_info().rss - before) / 2**20)
ref = np.concatenate([s.run(["y"], {"x": x[i:i+1], "r": r[i:i+1], "flag": np.array(False)})[0] for i in range(10)])
for f in (False, True):
    whole = run(10, f)
    print(f"flag={f}: whole vs one-at-a-time bitwise {np.array_equal(whole, ref)} maxdiff {np.abs(whole-ref).max():.2e}")
for f in (False, True):
    row = []
    for S in (1, 2, 4, 8):
        for _ in range(3): run(S, f)
        t = time.perf_counter(); n = 30
        for _ in range(n): run(S, f)
        row.append(f"{(time.perf_counter() - t) / n * 1000:.2f}")
    print(form, "flag", f, "ms 1/2/4/8:", " / ".join(row))
