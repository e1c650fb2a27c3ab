"""A sparse mixture-of-experts MLP (Qwen3-MoE, Qwen3.5-MoE) in the target graph: ONNX Runtime's MoE (float) or QMoE
(int4/int8), plus Qwen3.5-MoE's shared expert (a dense MLP like any other, times a sigmoid gate).

The router stays a float MatMul at every precision (an [E, H] matrix: small, and its top-k choice is what decides
which weights a token reads). Its logits go to the op, which takes softmax over all experts, keeps the top k and
divides them by their sum (transformers' norm_topk_prob); without norm_topk_prob QMoE is handed the softmax as its
routing weights instead (it would always divide by the sum; float MoE simply skips it).

Expert weights are [E, out, in] (nn.Linear's layout stacked over experts): fc1 [E, 2I, H] with each expert's gate and
up rows interleaved (gate row r at 2r, up row r at 2r + 1: swiglu_fusion=1, the only fusion ONNX Runtime's CPU
kernels take), fc2 [E, H, I]. int4/int8 quantize every row in blocks as MatMulNBits does (uint8 zero points, the
same nibble order); int4 experts run with the graph's accuracy level (int8 activations at 4), int8 experts with one
scale per row, the only int8 form whose CPU kernel keeps float activations (its block-wise form always quantizes
them), so a converted graph can still be held exactly to torch running the same weights (convert/pipeline.py).
Against numpy on the same weights (ONNX Runtime 1.32, CPU): float MoE 3e-7 apart, QMoE int4 in blocks of 32 1e-7,
int8 per row 1e-7; int8 in blocks 7e-3 (its activations rounded to int8).

Exact calls. The op's CPU kernels round a token differently depending on the other tokens of its call (an expert
given one row takes another kernel than one given several, and a token's k expert outputs are added in an order set
by how many tokens each expert received: docs/research-qmoe-rounding.md), so a k-token verification would not equal
k one-token steps. In graphs with exact calls the op therefore runs inside a Scan over chunks of the call's tokens:
the input EXPERT_CALLS_INPUT at 1 makes every token a chunk of its own (each expert sees one row, the order of a
token's contributions follows its own routing only: bitwise the same in any call), at 0 the whole call is one chunk
(the batched op, as fast as without the Scan). One op node either way, so its weights are prepacked once.

A GGUF's experts at `--precision gguf` on the CPU keep the file's blocks instead, in specrt's own MoE operator
(convert/ggml_experts.py), where the operators are built and the experts are plain SwiGLU: no requantizing, and
exact calls without the Scan.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from specrt.convert.ggml_experts import file_experts, ggml_experts
from specrt.convert.onnx_graph import MS_DOMAIN
from specrt.convert.quantize import quantize_blocks
from specrt.errors import SourceError


def expert_names(layer: int, expert: int) -> tuple[str, str, str]:
    """The HF names of one expert's gate, up and down projections."""
    p = f"model.layers.{layer}.mlp.experts.{expert}."
    return p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"


def router_logits_name(layer: int) -> str:
    """The graph value holding an MoE layer's router logits [N, E]."""
    return f"layers.{layer}.moe.router_logits"


def _interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Gate and up along the first axis, gate's row r at 2r and up's at 2r + 1 (swiglu_fusion=1): [2I, ...]."""
    fused = np.empty((2 * gate.shape[0], *gate.shape[1:]), dtype=np.float32)
    fused[0::2], fused[1::2] = gate, up
    return fused


def _fc1_rows(builder, layer: int, expert: int) -> np.ndarray:
    """One expert's gate and up rows interleaved: [2I, H] float32."""
    gate_name, up_name, _ = expert_names(layer, expert)
    return _interleave(np.asarray(builder.tensor(gate_name), dtype=np.float32),
                       np.asarray(builder.tensor(up_name), dtype=np.float32))


def _fc2_rows(builder, layer: int, expert: int) -> np.ndarray:
    """One expert's down projection: [H, I] float32."""
    return np.asarray(builder.tensor(expert_names(layer, expert)[2]), dtype=np.float32)


def _biases(builder, layer: int, name: str) -> tuple[str, str]:
    """gpt-oss's expert biases: fc1 [E, 2I] (gate and up interleaved as fc1's rows) and fc2 [E, H]."""
    cfg = builder.cfg
    fc1, fc2 = [], []
    for e in range(cfg.num_experts):
        gate, up, down = (n.replace(".weight", ".bias") for n in expert_names(layer, e))
        fc1.append(_interleave(np.asarray(builder.tensor(gate), np.float32),
                               np.asarray(builder.tensor(up), np.float32)))
        fc2.append(np.asarray(builder.tensor(down), np.float32))
    return (builder.g.weight(name + ".fc1_bias", np.stack(fc1).astype(builder.dtype)),
            builder.g.weight(name + ".fc2_bias", np.stack(fc2).astype(builder.dtype)))


def _quantized_experts(builder, layer: int, which: str, block: int):
    """Every expert's fc1 ("fc1") or fc2 ("fc2") quantized: (packed [E, N, K * bits / 8], scales [E, N, K / block],
    zero points [E, N, ceil(K / block * bits / 8)]), read and quantized an expert at a time."""
    cfg, bits = builder.cfg, builder.opts.bits
    packed, scales, zero_points = [], [], []
    for e in range(cfg.num_experts):
        w = _fc1_rows(builder, layer, e) if which == "fc1" else _fc2_rows(builder, layer, e)
        q = quantize_blocks(w, block, bits=bits)
        packed.append(q.packed.reshape(q.n, -1))
        scales.append(q.scales.reshape(q.n, -1))
        zero_points.append(q.zero_points.reshape(q.n, -1))
    return np.stack(packed), np.stack(scales), np.stack(zero_points), q


def sparse_moe(builder, layer: int, h: str) -> str:
    """h [B, S, H] -> the layer's mixture-of-experts output [B, S, H] (plus its shared expert's, if it has one)."""
    out = _routed_experts(builder, layer, h)
    if not builder.cfg.shared_expert_size:
        return out
    g, p = builder.g, f"model.layers.{layer}.mlp."
    shared = builder.dense_mlp(h, p + "shared_expert.", builder.cfg.shared_expert_size, f"layers.{layer}.shared_expert")
    gate_w = np.asarray(builder.tensor(p + "shared_expert_gate.weight"), dtype=np.float32)  # [1, H]
    gate = g.op("MatMul", [h, g.weight(f"layers.{layer}.shared_expert_gate_t", gate_w.T.astype(builder.dtype))])
    return g.op("Add", [out, g.op("Mul", [shared, g.op("Sigmoid", [gate])])])  # [B, S, H]


def _routed_experts(builder, layer: int, h: str) -> str:
    """h [B, S, H] -> the routed experts' weighted sum [B, S, H]."""
    from specrt.convert.quant_rows import QuantRows

    cfg, g, p = builder.cfg, builder.g, f"model.layers.{layer}.mlp."
    name = f"layers.{layer}.moe"
    router = np.asarray(builder.tensor(p + "gate.weight"), dtype=np.float32)  # [E, H]
    flat = g.op("Reshape", [h, g.const([-1, cfg.hidden_size])])  # [N, H]
    logits_name = [router_logits_name(layer)]  # named, for scripts that read the routing
    router_t = g.weight(name + ".router_t", router.T.astype(builder.dtype))
    if cfg.moe_bias:
        logits = g.op("Add", [g.op("MatMul", [flat, router_t]), builder.param(p + "gate.bias")], outputs=logits_name)
    else:
        logits = g.op("MatMul", [flat, router_t], outputs=logits_name)  # [N, E]
    plain_swiglu = not (cfg.moe_bias or cfg.swiglu_limit) and cfg.swiglu_alpha == 1.0 and cfg.swiglu_beta == 0.0
    own = file_experts(builder, [expert_names(layer, e) for e in range(cfg.num_experts)]) if plain_swiglu else None
    if own is not None:  # the file's own blocks, in specrt's operator: the routing here, the experts there
        top, ids = g.op("TopK", [g.op("Softmax", [logits], axis=-1), g.const([cfg.experts_per_token])], outputs=2,
                        axis=-1)  # [N, k]
        if cfg.norm_topk_prob:
            top = g.op("Div", [top, g.op("ReduceSum", [top, g.const([-1])], keepdims=1)])
        return ggml_experts(builder, own, h, ids, top, "silu", name)
    common = dict(k=cfg.experts_per_token, activation_type="swiglu", swiglu_fusion=1,
                  activation_alpha=float(cfg.swiglu_alpha), activation_beta=float(cfg.swiglu_beta))
    if cfg.swiglu_limit:
        common["swiglu_limit"] = float(cfg.swiglu_limit)
    bias1, bias2 = _biases(builder, layer, name) if cfg.moe_bias else ("", "")
    if not builder.opts.bits:
        fc1 = np.stack([_fc1_rows(builder, layer, e) for e in range(cfg.num_experts)])  # [E, 2I, H]
        fc2 = np.stack([_fc2_rows(builder, layer, e) for e in range(cfg.num_experts)])  # [E, H, I]
        ins = [h, logits, g.weight(name + ".fc1", fc1.astype(builder.dtype)), bias1,
               g.weight(name + ".fc2", fc2.astype(builder.dtype)), bias2]
        return _expert_op(builder, "MoE", name, ins, "", normalize_routing_weights=int(cfg.norm_topk_prob), **common)
    bits = builder.opts.bits
    per_row = bits == 8
    block = builder.opts.int4_block_size
    if not per_row and (cfg.hidden_size % block or cfg.moe_intermediate_size % block):
        raise SourceError(f"int{bits} experts need hidden_size ({cfg.hidden_size}) and moe_intermediate_size "
                          f"({cfg.moe_intermediate_size}) to be multiples of the {block}-weight block")
    if builder.opts.precision == "gguf":  # QMoE takes one block form for every expert: quantized here, said so
        for e in range(cfg.num_experts):
            for n in expert_names(layer, e):
                builder.gguf_requantized[n] = f"experts (int{bits} for QMoE)"
    stored = {}
    for which, width in (("fc1", cfg.hidden_size), ("fc2", cfg.moe_intermediate_size)):
        block = width if per_row else builder.opts.int4_block_size
        packed, scales, zero_points, q = _quantized_experts(builder, layer, which, block)
        shape = scales.shape[:2]  # [E, N]
        stored[which] = (g.weight(f"{name}.{which}.qweight", packed),
                         g.weight(f"{name}.{which}.scales", (scales.reshape(shape) if per_row else scales)
                                  .astype(builder.dtype)),
                         g.weight(f"{name}.{which}.zero_points",
                                  zero_points.reshape(shape) if per_row else zero_points),
                         q.n, q.k, q.block_size)
        del packed, scales, zero_points
    (w1, s1, z1, n1, k1, b1), (w2, s2, z2, n2, k2, b2) = stored["fc1"], stored["fc2"]
    routing = ""
    if not cfg.norm_topk_prob:  # QMoE always divides by the sum: hand it the plain softmax to mix with
        routing = g.op("Softmax", [logits], axis=-1)
    ins = [h, logits, w1, s1, bias1, w2, s2, bias2, "", "", "", z1, z2]
    for e in range(cfg.num_experts):  # where each expert's rows went, for the torch model of the same weights
        gate_name, up_name, down_name = expert_names(layer, e)
        builder.quant_rows[gate_name] = QuantRows(w1, s1, z1, e * n1, (e + 1) * n1, cfg.num_experts * n1, k1, b1,
                                                  bits, step=2)
        builder.quant_rows[up_name] = QuantRows(w1, s1, z1, e * n1 + 1, (e + 1) * n1, cfg.num_experts * n1, k1, b1,
                                                bits, step=2)
        builder.quant_rows[down_name] = QuantRows(w2, s2, z2, e * n2, (e + 1) * n2, cfg.num_experts * n2, k2, b2, bits)
    attrs = dict(expert_weight_bits=bits, weights_prepacked=0, normalize_routing_weights=int(cfg.norm_topk_prob))
    if not per_row:
        attrs.update(block_size=builder.opts.int4_block_size, accuracy_level=builder.opts.accuracy_level)
    return _expert_op(builder, "QMoE", name, ins, routing, **common, **attrs)


def _expert_op(builder, op_type: str, name: str, ins: list[str], routing: str, **attrs) -> str:
    """The MoE / QMoE node over ins = [h [B, S, H], router logits [N, E], weights...] (routing: QMoE's optional
    routing weights [N, E], or ""), run inside a Scan over chunks of tokens where the graph has exact calls."""
    g = builder.g
    expert_calls = builder.expert_calls_input()
    if expert_calls is None:
        ins = ins + ["", routing] if routing else ins
        while ins[-1] == "":
            ins.pop()
        return g.op(op_type, ins, domain=MS_DOMAIN, name=name, **attrs)
    h, logits, weights = ins[0], ins[1], ins[2:]
    width = builder.cfg.hidden_size
    tokens = g.op("Gather", [g.op("Shape", [logits]), g.const([0])], axis=0)  # [1]: N
    chunk = g.op("Where", [g.op("Cast", [expert_calls], to=TensorProto.BOOL), g.const([1]), tokens])  # [1]
    scanned = [h, logits] + ([routing] if routing else [])
    chunks = [g.op("Reshape", [x, g.op("Concat", [g.const([-1]), chunk, g.op("Shape", [x], start=-1)], axis=0)])
              for x in scanned]  # each [N / chunk, chunk, width]
    body_in = [f"{name}.chunk.{j}" for j in range(len(scanned))]
    body_ins = [body_in[0], body_in[1]] + weights + (["", body_in[2]] if routing else [])
    while body_ins[-1] == "":
        body_ins.pop()
    elem = builder.elem
    body = helper.make_graph(
        [helper.make_node(op_type, body_ins, [f"{name}.chunk.out"], name=name, domain=MS_DOMAIN, **attrs)],
        f"{name}.chunk",
        [helper.make_tensor_value_info(n, elem, ["chunk", None]) for n in body_in],
        [helper.make_tensor_value_info(f"{name}.chunk.out", elem, ["chunk", width])])
    out = g.op("Scan", chunks, name=name + ".tokens", num_scan_inputs=len(chunks), body=body)  # [N / chunk, chunk, H]
    return g.op("Reshape", [out, g.op("Shape", [h])])  # [B, S, H]
