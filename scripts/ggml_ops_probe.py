"""specrt's GGUF operators (specrt/kernels/ggml_ops) on a real GGUF's matrices, against ONNX Runtime's MatMulNBits
forms of the same exact weights (convert/gguf_exact.py): one graph per form holding every layer's matrices of the
chosen kinds (far more bytes than the CPU's caches: read from memory as decoding reads them), timed at several row
counts; ms per call and the bytes each form reads per call.

    python scripts/ggml_ops_probe.py MODEL.gguf [--kinds ffn_gate,ffn_up] [--types Q6_K] [--rows 1,2,4,8,16] [--reps 10]

Records the CPU flags with the figures (docs/performance.md: compare only within one run).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _graph(path: str, tensors, kinds: list[str], ggml: bool, types: list[str] | None = None):
    """(model bytes, bytes of weights, K): every layer's `kinds` matrices written as conversion writes them (the
    target graph's builder, with or without the operators), summed into one output."""
    from onnx import TensorProto

    from specrt.convert.gguf_exact import exact_weight
    from specrt.convert.target_graph import GraphOptions, _TargetBuilder
    from specrt.kernels import ggml_ops
    from specrt.models.config import config_from_hf
    from specrt.models.gguf_loader import load_gguf

    builder = _TargetBuilder(config_from_hf(load_gguf(path)[0]), {},
                             GraphOptions(precision="gguf", ggml_operators=ggml), None)
    outs, k = [], None
    for t in tensors:
        if not any(f".{kind}.weight" in t.name for kind in kinds) or t.tensor_type.name not in ggml_ops.OPS:
            continue
        if types and t.tensor_type.name not in types:
            continue
        n, k_t = int(t.shape[1]), int(t.shape[0])
        if k not in (None, k_t):
            continue  # one input width per graph
        if k is None:
            k = k_t
            builder.g.add_input("A", TensorProto.FLOAT, [1, "S", k])
        raw = np.ascontiguousarray(t.data).view(np.uint8)
        weight = exact_weight(t.tensor_type.name, raw.tobytes(), (n, k), t.name)
        outs.append(builder.matmul_nbits("A", [t.name], [weight], t.name.replace(".", "_"), None))
    builder.g.op("Sum", outs, outputs=["Y"])
    builder.g.add_output("Y", TensorProto.FLOAT, None)
    total = sum(len(init.raw_data) for init in builder.g.initializers)
    return builder.g.model().SerializeToString(), total, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--kinds", default="ffn_gate,ffn_up", help="tensor kinds, comma-separated (blk.N.KIND.weight)")
    ap.add_argument("--rows", default="1,2,4,8,16", help="rows per call (tokens), comma-separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--types", default="", help="only tensors of these GGUF types, comma-separated (e.g. Q6_K)")
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
        model, total, k = _graph(args.gguf, tensors, args.kinds.split(","), ggml,
                                     args.types.split(",") if args.types else None)
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
