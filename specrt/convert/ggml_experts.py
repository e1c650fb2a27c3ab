"""A mixture-of-experts layer's experts in the GGUF file's own blocks, run by specrt's MoE operator
(kernels/ggml_ops/ggml_moe.c), for `--precision gguf` on the CPU where the operators are built.

ONNX Runtime's QMoE takes one block form for every expert, so a GGUF's experts (Q4_K gate and up, Q6_K or Q4_K down
in llama.cpp's Q4_K_M) were requantized for it: other weights than the file's, and more bytes a token. Here each
expert keeps its blocks (rows interleaved by 8, the experts stacked: gate and up [E * I / 8, ...], down
[E * H / 8, ...]), the routing stays in the graph (softmax, top k, their weights), and the operator reads only the
chosen experts. A token's output depends on its own routing only (ggml_moe.c), so exact calls need no Scan over
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.convert.gguf_exact import FORMS
from specrt.convert.quant_rows import QuantRows

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # the operator's attribute


@dataclass
class FileExperts:
    """A layer's experts as the file's blocks: per projection its ggml type and each expert's [rows, row bytes]
    (fused: "gate" holds each expert's gate rows then its up rows, and there is no "up")."""

    types: dict[str, str]  # "gate" / "up" / "down" -> "Q4_K", ...
    blocks: dict[str, list[np.ndarray]]
    names: dict[str, list[str]]  # each expert's HF weight name (for the exact check's readback)
    fused: bool = False


def file_blocks(builder, name: str) -> tuple[str, np.ndarray] | None:
    """A GGUF weight's own blocks (its type, [rows, row bytes]) where specrt's operators take its type and the
    loader moves nothing in it; else None."""
    from specrt.kernels.ggml_ops import OPS

    ref = builder.gguf_ref(builder.alias.get(name, name))
    if ref is None or ref.gguf_type not in OPS or ref.reorder is not None or len(ref.shape) != 2:
        return None
    form = FORMS[ref.gguf_type]
    rows, cols = ref.shape
    if cols % form.type_block or ref.nbytes != rows * cols // form.type_block * form.type_size:
        return None
    return ref.gguf_type, np.frombuffer(bytes(ref.raw()), dtype=np.uint8).reshape(rows, -1)


def file_experts(builder, names: list[tuple[str, ...]]) -> FileExperts | None:
    """Each expert's (gate, up, down) HF names, or (gate_up, down) for a fused gate and up (Gemma 4's
    gate_up_proj, gate rows first) -> their blocks, or None where any is not in a form the operator takes (another
    source, a type it lacks, rows not a multiple of 8)."""
    if not (builder.opts.ggml_operators and builder.opts.precision == "gguf"):
        return None
    parts = ("gate", "up", "down") if len(names[0]) == 3 else ("gate", "down")
    types, blocks = {}, {p: [] for p in parts}
    for expert in names:
        for part, name in zip(parts, expert):
            found = file_blocks(builder, name)
            if found is None or found[1].shape[0] % 8 or types.setdefault(part, found[0]) != found[0]:
                return None
            blocks[part].append(found[1])
    fused = len(parts) == 2
    if fused and blocks["gate"][0].shape[0] % 16:  # each half whole groups of 8 rows
        return None
    return FileExperts(types, blocks, {p: [n[j] for n in names] for j, p in enumerate(parts)}, fused)


def ggml_experts(builder, experts: FileExperts, x: str, ids: str, weights: str, activation: str, name: str) -> str:
    """x [..., H], ids [N, k] int64, weights [N, k] (N: x's rows) -> sum over j of weights[:, j] times expert
    ids[:, j] applied to x: [..., H]."""
    from specrt.kernels import ggml_ops
    from specrt.kernels.ggml_ops.layout import interleave

    g = builder.g
    gate_rows, hidden = experts.blocks["gate"][0].shape[0], experts.blocks["down"][0].shape[0]
    inter = gate_rows // 2 if experts.fused else gate_rows
    stored = {}
    for part in experts.blocks:
        qtype, rows = experts.types[part], experts.blocks[part][0].shape[0]
        form = FORMS[qtype]
        k = inter if part == "down" else hidden
        stacked = np.concatenate([interleave(qtype, b) for b in experts.blocks[part]])  # [E * rows / 8, bytes * 8]
        stored[part] = g.weight(f"{name}.{part}.ggml", stacked)
        total = rows * len(experts.blocks[part])
        for e, hf_name in enumerate(experts.names[part]):
            builder.quant_rows[hf_name] = QuantRows(stored[part], "", "", e * rows, (e + 1) * rows, total, k,
                                                    form.block, form.bits, ggml_type=qtype)
    number = ggml_ops.TYPE_NUMBERS
    up = "gate" if experts.fused else "up"
    return g.op("MoE", [x, ids, weights, stored["gate"], stored[up], stored["down"]], domain=ggml_ops.DOMAIN,
                name=name, experts=len(experts.blocks["gate"]), inter=inter, gate_type=number[experts.types["gate"]],
                up_type=number[experts.types[up]], down_type=number[experts.types["down"]],
                activation=ACTIVATIONS[activation], accuracy_level=builder.opts.accuracy_level,
                fused_gate_up=int(experts.fused))
