"""specrt's GGUF operators (specrt/kernels/ggml_ops) on a real GGUF's matrices, against ONNX Runtime's MatMulNBits
forms of the same exact weights (convert/gguf_exact.py): one graph per form holding every layer's matrices of the
chosen kinds (far more bytes than the CPU's caches: read from memory as decoding reads them), timed at several row
counts; ms per call and the bytes each form reads per call.

    python scripts/ggml_ops_probe.py MODEL.gguf [--kinds ffn_gate,ffn_up] [--rows 1,2,4,8,16] [--reps 10]

Records the CPU flags with the figures (docs/performance.md: compare only within one run).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _graph(tensors, kinds: list[str], ggml: bool):
    """(model bytes, bytes of weights, K): every layer's `kinds` matrices as one graph, summed into one output."""
    from onnx import TensorProto, helper, numpy_helper

    from specrt.convert.gguf_exact import exact_weight
    from specrt.convert.onnx_graph import MS_DOMAIN
    from specrt.kernels import ggml_ops

    nodes, inits, outs, total, k = [], [], [], 0, None
    for t in tensors:
        if not any(f".{kind}.weight" in t.name for kind in kinds) or t.tensor_type.name not in ggml_ops.OPS:
            continue
        n, k_t = int(t.shape[1]), int(t.shape[0])
        if k not in (None, k_t):
            continue  # one input width per graph
        k = k_t
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(n, -1)
        name = t.name.replace(".", "_")
        if ggml:
            inits.append(numpy_helper.from_array(raw, name))
            total += raw.nbytes
            nodes.append(helper.make_node(ggml_ops.OPS[t.tensor_type.name], ["A", name], [name + "_y"],
                                          domain=ggml_ops.DOMAIN))
        else:
            q = exact_weight(t.tensor_type.name, raw.tobytes(), (n, k), t.name)
            parts = [numpy_helper.from_array(q.packed, name + "_q"), numpy_helper.from_array(q.scales, name + "_s"),
                     numpy_helper.from_array(q.zero_points, name + "_z")]
            inits += parts
            total += sum(p.nbytes for p in (q.packed, q.scales, q.zero_points))
            y = name + "_y"
            nodes.append(helper.make_node("MatMulNBits", ["A", name + "_q", name + "_s", name + "_z"], [y],
                                          domain=MS_DOMAIN, K=k, N=n, bits=q.bits, block_size=q.block_size,
                                          accuracy_level=4))
            if q.mins is not None:  # the minimums' correction, as convert/target_graph.py writes it
                mins = numpy_helper.from_array(q.mins.reshape(n, -1).T.copy(), name + "_m")
                inits.append(mins)
                total += q.mins.nbytes
                shape = helper.make_tensor(name + "_shape", TensorProto.INT64, [4], [0, 0, -1, q.block_size])
                nodes += [helper.make_node("Reshape", ["A", name + "_shape"], [name + "_b"]),
                          helper.make_node("ReduceSum", [name + "_b", "axis_last"], [name + "_bs"], keepdims=0),
                          helper.make_node("MatMul", [name + "_bs", name + "_m"], [name + "_c"]),
                          helper.make_node("Sub", [y, name + "_c"], [name + "_yc"])]
                inits.append(shape)
        outs.append(nodes[-1].output[0])
    inits.append(helper.make_tensor("axis_last", TensorProto.INT64, [1], [-1]))
    nodes.append(helper.make_node("Sum", outs, ["Y"]) if len(outs) > 1 else helper.make_node("Identity", outs, ["Y"]))
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "S", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    imports = [helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1), helper.make_opsetid(ggml_ops.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=imports).SerializeToString(), total, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--kinds", default="ffn_gate,ffn_up", help="tensor kinds, comma-separated (blk.N.KIND.weight)")
    ap.add_argument("--rows", default="1,2,4,8,16", help="rows per call (tokens), comma-separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import gguf
    import onnxruntime as ort

    from specrt.kernels import ggml_ops

    flags = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    print("cpu flags:", " ".join(f for f in flags.split() if f.startswith(("avx", "amx", "fma", "f16c"))))
    tensors = gguf.GGUFReader(args.gguf).tensors
    rows = [int(r) for r in args.rows.split(",")]
    sessions = {}
    for label, ggml in (("specrt ggml_ops", True), ("MatMulNBits forms", False)):
        model, total, k = _graph(tensors, args.kinds.split(","), ggml)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        ggml_ops.register(opts)
        sessions[label] = (ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]), total, k)
    print("| form | MB read a call | " + " | ".join(f"{r} rows (ms)" for r in rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    for label, (session, total, k) in sessions.items():
        cells = []
        for r in rows:
            x = np.random.default_rng(0).standard_normal((1, r, k)).astype(np.float32)
            for _ in range(2):
                session.run(None, {"A": x})
            start = time.perf_counter()
            for _ in range(args.reps):
                session.run(None, {"A": x})
            cells.append(f"{(time.perf_counter() - start) / args.reps * 1e3:.2f}")
        print(f"| {label} | {total / 1e6:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
