"""Probe: is ONNX Runtime's GroupQueryAttention (CPU) call-invariant? A token's attention output is computed once
in one-token calls (padded to two query rows, as batch-invariant mode runs them) and once in calls of 2, 3 and 6
tokens, over the same random queries, keys and values; prefixes where any split differs are listed. Finding (ORT
1.32, AMD EPYC avx512): head size 256 differs near 64 and 192 keys, 512 near 96, 160, 224 (GEMM blocking: a token's
row rounds by the key count of the call it is in), head size 128 nowhere in 54..135 keys. A wider run of the same
calls (with a causal bias, prefixes 300-1000 every 11) found 256 at 443 and 828, 512 at 410, 476, 542, 795, 861.
Batch-invariant mode therefore computes the attention itself (convert/exact_attention.py), whose call invariance
tests/test_exact_attention.py checks at these head sizes.

    python scripts/gqa_call_invariance_probe.py
"""
import argparse
argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
import numpy as np, onnxruntime as ort
from onnx import helper, numpy_helper, TensorProto
rng = np.random.default_rng(0)
def build(N, KV, D, M=512):
    inv = 1.0 / 10000 ** (np.arange(0, D, 2) / D)
    ang = np.arange(M)[:, None] * inv[None]
    inits = [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos"), numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin")]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin", "pos", "bias"],
                            ["o", "yk", "yv"], domain="com.microsoft", num_heads=N, kv_num_heads=KV, do_rotary=1, rotary_interleaved=0, scale=1.0, local_window_size=-1)
    ins = [helper.make_tensor_value_info("q", 1, [1, None, N * D]), helper.make_tensor_value_info("k", 1, [1, None, KV * D]),
           helper.make_tensor_value_info("v", 1, [1, None, KV * D]), helper.make_tensor_value_info("pk", 1, [1, KV, M, D]),
           helper.make_tensor_value_info("pv", 1, [1, KV, M, D]), helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
           helper.make_tensor_value_info("total", TensorProto.INT32, []), helper.make_tensor_value_info("pos", TensorProto.INT64, [1, None]),
           helper.make_tensor_value_info("bias", 1, [1, 1, None, None])]
    outs = [helper.make_tensor_value_info("o", 1, None), helper.make_tensor_value_info("yk", 1, [1, KV, M, D]), helper.make_tensor_value_info("yv", 1, [1, KV, M, D])]
    g = helper.make_graph([node], "g", ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
def run(s, N, KV, D, prefix, split, qs, ks, vs, M=512):
    kbuf = np.zeros((1, KV, M, D), np.float32); vbuf = np.zeros_like(kbuf)
    kov, vov = ort.OrtValue.ortvalue_from_numpy(kbuf), ort.OrtValue.ortvalue_from_numpy(vbuf)
    b = s.io_binding()
    b.bind_ortvalue_input("pk", kov); b.bind_ortvalue_input("pv", vov); b.bind_ortvalue_output("yk", kov); b.bind_ortvalue_output("yv", vov)
    outs = []; pos = 0
    for n in [prefix] + split:
        rows = max(n, 2)  # attention_min_rows 2: pad one-row calls with a copy
        sl = slice(pos, pos + n)
        q, k, v = qs[:, sl], ks[:, sl], vs[:, sl]
        p = np.arange(pos, pos + n)[None]
        if rows > n:
            q, k, v = (np.concatenate([a, a[:, -1:]], 1) for a in (q, k, v)); p = np.concatenate([p, p[:, -1:] + 1], 1)
        total = pos + rows
        b.bind_cpu_input("q", np.ascontiguousarray(q)); b.bind_cpu_input("k", np.ascontiguousarray(k)); b.bind_cpu_input("v", np.ascontiguousarray(v))
        b.bind_cpu_input("seqlens", np.array([total - 1], np.int32)); b.bind_cpu_input("total", np.array(total, np.int32))
        b.bind_cpu_input("pos", p.astype(np.int64)); b.bind_cpu_input("bias", np.zeros((1, 1, rows, total), np.float32))
        b.bind_output("o", "cpu")
        s.run_with_iobinding(b)
        outs.append(b.get_outputs()[2].numpy()[:, :n]); pos += n
    return np.concatenate(outs[1:], 1)
for N, KV, D in ((8, 2, 256), (8, 2, 512), (8, 1, 512)):
    s = build(N, KV, D)
    bad = []
    for prefix in range(40, 270, 2):
        qs = rng.standard_normal((1, prefix + 6, N * D)).astype(np.float32)
        ks = rng.standard_normal((1, prefix + 6, KV * D)).astype(np.float32)
        vs = rng.standard_normal((1, prefix + 6, KV * D)).astype(np.float32)
        base = run(s, N, KV, D, prefix, [1] * 6, qs, ks, vs)
        d = max(float(np.abs(run(s, N, KV, D, prefix, sp, qs, ks, vs) - base).max()) for sp in ([2, 2, 2], [3, 3], [6]))
        if d: bad.append(prefix)
    print(N, KV, D, "non-invariant at prefixes", bad)
