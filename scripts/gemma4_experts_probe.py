"""Micro-benchmark behind convert/gemma4_graph.py: Gemma 4 26B-A4B-shaped experts (E=128, k=8, H=2816, I=704,
random int4 weights) as one If per expert holding its two MatMulNBits over outer-scope initializers, run on the
whole call (`flat`) or inside a Scan over tokens (`scan`). Usage: python scripts/gemma4_experts_probe.py 128 flat|scan"""
import argparse
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("experts", type=int, help="experts in the layer (26B-A4B: 128)")
ap.add_argument("form", choices=("flat", "scan"))
args = ap.parse_args()
import numpy as np, onnxruntime as ort, time
from onnx import helper, numpy_helper
E, k, H, I, blk = args.experts, 8, 2816, 704, 32
rng = np.random.default_rng(0)
inits, nodes = [], []
def mnb(x, name, N, K, out):
    inits.append(numpy_helper.from_array(rng.integers(0, 255, (N, K // blk, blk // 2), dtype=np.uint8), name + ".q"))
    inits.append(numpy_helper.from_array((rng.random(N * K // blk) * 0.01).astype(np.float32), name + ".s"))
    return helper.make_node("MatMulNBits", [x, name + ".q", name + ".s"], [out], domain="com.microsoft", K=K, N=N,
                            bits=4, block_size=blk, accuracy_level=4)
# body: x [c, H], w [c, E] -> y [c, H]
body_nodes, outs = [], []
for e in range(E):
    then_nodes = [mnb("bx", f"e{e}.fc1", 2 * I, H, f"e{e}.gu"),
                  helper.make_node("Split", [f"e{e}.gu", "halves"], [f"e{e}.g", f"e{e}.u"], axis=-1),
                  helper.make_node("FastGelu", [f"e{e}.g"], [f"e{e}.a"], domain="com.microsoft"),
                  helper.make_node("Mul", [f"e{e}.a", f"e{e}.u"], [f"e{e}.m"]),
                  mnb(f"e{e}.m", f"e{e}.fc2", H, I, f"e{e}.d"),
                  helper.make_node("Gather", ["bw", f"c{e}"], [f"e{e}.wt"], axis=1),
                  helper.make_node("Mul", [f"e{e}.d", f"e{e}.wt"], [f"e{e}.y"])]
    then_g = helper.make_graph(then_nodes, f"then{e}", [], [helper.make_tensor_value_info(f"e{e}.y", 1, None)])
    else_g = helper.make_graph([helper.make_node("Constant", [], [f"z{e}"], value=numpy_helper.from_array(np.zeros((1, 1), np.float32)))],
                               f"else{e}", [], [helper.make_tensor_value_info(f"z{e}", 1, None)])
    inits.append(numpy_helper.from_array(np.array([e], np.int64), f"c{e}"))
    body_nodes += [helper.make_node("Gather", ["bw", f"c{e}"], [f"col{e}"], axis=1),
                   helper.make_node("ReduceMax", [f"col{e}"], [f"mx{e}"], keepdims=0),
                   helper.make_node("Greater", [f"mx{e}", "zero"], [f"cond{e}"]),
                   helper.make_node("If", [f"cond{e}"], [f"y{e}"], then_branch=then_g, else_branch=else_g)]
    outs.append(f"y{e}")
inits.append(numpy_helper.from_array(np.array(0, np.float32), "zero")); inits.append(numpy_helper.from_array(np.array([I, I], np.int64), "halves"))
body_nodes.append(helper.make_node("Sum", outs, ["by"]))
body = helper.make_graph(body_nodes, "body", [helper.make_tensor_value_info("bx", 1, ["c", H]), helper.make_tensor_value_info("bw", 1, ["c", E])],
                         [helper.make_tensor_value_info("by", 1, ["c", H])])
if args.form == "scan":
    scan = helper.make_node("Scan", ["x", "w"], ["y"], num_scan_inputs=2, body=body)
    g = helper.make_graph([scan], "g", [helper.make_tensor_value_info("x", 1, [None, None, H]),
                                        helper.make_tensor_value_info("w", 1, [None, None, E])],
                          [helper.make_tensor_value_info("y", 1, [None, None, H])], inits)
else:
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["bx"]), helper.make_node("Reshape", ["w", "flatw"], ["bw"])]
    inits += [numpy_helper.from_array(np.array([-1, H], np.int64), "flat"),
              numpy_helper.from_array(np.array([-1, E], np.int64), "flatw")]
    g = helper.make_graph(nodes + list(body.node), "g", [helper.make_tensor_value_info("x", 1, [None, None, H]),
                                                         helper.make_tensor_value_info("w", 1, [None, None, E])],
                          [helper.make_tensor_value_info("by", 1, None)], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
for n in (1, 4):
    x = rng.standard_normal((n, 1, H)).astype(np.float32)
    w = np.zeros((n, 1, E), np.float32)
    for t in range(n):
        w[t, 0, rng.choice(E, k, replace=False)] = 1 / k
    s.run(None, {"x": x, "w": w})
    t0 = time.perf_counter()
    for _ in range(10): s.run(None, {"x": x, "w": w})
    print(f"E={E} tokens={n}: {(time.perf_counter() - t0) / 10 * 1000:.2f} ms per layer call")
