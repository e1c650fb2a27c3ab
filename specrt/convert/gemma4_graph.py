"""The parts of a Gemma 4 target graph that other families lack (models/gemma4.py is the reference).

per_layer_inputs: E2B/E4B's per-layer input embeddings, every layer's [B, S, L, P] from the token ids and the scaled
embeddings; gemma4_layer_rest: a layer after its attention (sandwich norms, the dense MLP and, in MoE models, the
experts beside it, the per-layer input, the layer scalar). The attention itself (own head sizes per layer kind,
weightless value norms, keys as values, layers that read another's cache) is the target builder's
(gemma4_qkv, then the target builder's `attention`).

Experts. Gemma 4's experts are gated GELU (down(gelu_tanh(gate) * up)); ONNX Runtime's CPU MoE / QMoE take SwiGLU
only ("FC3 is not implemented for CPU MoE"), so gemma4_experts builds them from plain ops: the router (softmax over
all experts, top k divided by their sum, times per_expert_scale) gives a dense [N, E] weight matrix, then each expert
is an If that runs its two projections (MatMulNBits over its own initializers, prepacked once) on the call's rows
only when some token of the call chose it, times its column of weights; the experts' outputs are summed in expert
order. A token's sum is then its own whatever the call's other tokens chose (an expert it did not choose adds an
exact zero), and each projection sees the call's row count as every dense projection does, so the runtime's
batch-invariant padding makes the experts exact too: no Scan over tokens (an If nested in a Scan body loses ONNX
Runtime's prepacked weights: a one-token call of a layer at 26B-A4B's shapes took 66 ms instead of 1.3-1.5 ms,
docs/performance.md, "Plain decoding on the CPU against llama.cpp and others").

On a GPU each If is a device-to-host sync (its condition is read on the host), 128 a layer at 26B-A4B. A GPU graph
gathers instead (_gathered_experts): every token's k chosen experts' weights are looked up by expert id and
dequantized in one GatherBlockQuantized ([N, k, 2I, H] float16, on CUDA), then multiplied as a batch of small
matrices; no control flow, no host round trip, at the cost of writing the chosen experts out dequantized and reading
them back (about 7x their int4 bytes) where a gated-GELU QMoE would read them in place (ONNX Runtime has none: its
MoE/QMoE activations are relu, gelu, silu, swiglu and identity).

A GGUF's experts at `--precision gguf` on the CPU, where every expert's blocks are of a type specrt's operators take,
run in specrt's MoE operator instead (convert/ggml_experts.py: gated GELU, the file's blocks, only the chosen experts
read, no If).
"""

from __future__ import annotations

import math
import numpy as np
from onnx import helper

from specrt.convert.ggml_experts import file_experts, ggml_experts
from specrt.convert.onnx_graph import MS_DOMAIN, captured
from specrt.convert.quant_rows import QuantRows
from specrt.convert.quantize import concat_rows, same_form
from specrt.errors import SpecrtError

PLE_TABLE = "model.embed_tokens_per_layer.weight"


def per_layer_inputs(b, embedded: str) -> str:
    """ple = (RMS_w(reshape(embedded @ W_plm^T / sqrt(H))) + E_ple[ids] * sqrt(P)) / sqrt(2): [B, S, L, P].
    b: the target builder; embedded: the scaled token embeddings [B, S, H]."""
    cfg, g = b.cfg, b.g
    shape = g.const([0, 0, cfg.num_layers, cfg.ple_size])
    tokens, _ = b.embed_lookup(PLE_TABLE, cfg.num_layers * cfg.ple_size)  # [B, S, L * P]
    tokens = g.op("Mul", [g.op("Reshape", [tokens, shape]), g.const(math.sqrt(cfg.ple_size), dtype=b.dtype)])
    context = b.linear(embedded, ["model.per_layer_model_projection"], "per_layer_model_projection")
    context = g.op("Mul", [context, g.const(cfg.hidden_size ** -0.5, dtype=b.dtype)])
    context = b.norm(g.op("Reshape", [context, shape]), "model.per_layer_projection_norm.weight")
    return g.op("Mul", [g.op("Add", [context, tokens]), g.const(2 ** -0.5, dtype=b.dtype)])


def gemma4_qkv(b, i: int, h: str) -> tuple[str, str, str]:
    """Gemma 4 (per-layer head sizes, keys that may be the values, weightless value norms): q, k, v [B, S, . * D]
    before rotary; k and v are "" where the layer reads another layer's cache."""
    cfg, p = b.cfg, f"model.layers.{i}.self_attn."
    d, kv, n = cfg.head_dim_of(i), cfg.kv_heads_of(i), cfg.num_heads
    if cfg.kv_source(i) != i:  # reads another layer's cache: only the query is its own
        q = b.head_norm(b.linear(h, [p + "q_proj"], f"layers.{i}.q"), n, p + "q_norm.weight", d)
        return q, "", ""
    shared_v = cfg.k_eq_v(i)  # the values are the key projection, normed without a weight
    names = [p + "q_proj", p + "k_proj"] + ([] if shared_v else [p + "v_proj"])
    qkv = b.linear(h, names, f"layers.{i}.qkv")
    sizes = [n * d, kv * d] + ([] if shared_v else [kv * d])
    parts = b.g.op("Split", [qkv, b.g.const(sizes)], outputs=len(sizes), axis=-1)
    q, k, v = parts[0], parts[1], parts[1] if shared_v else parts[2]
    q = b.head_norm(q, n, p + "q_norm.weight", d)
    v = b.head_norm(v, kv, None, d) if cfg.v_norm else v
    return q, b.head_norm(k, kv, p + "k_norm.weight", d), v


def gemma4_layer_rest(b, i: int, x: str, attn: str, ple: str | None) -> str:
    """The residual after layer i, from the residual before it x and its attention output attn [B, S, H]."""
    g, cfg, p = b.g, b.cfg, f"model.layers.{i}."
    attn = b.norm(attn, p + "post_attention_layernorm.weight")
    h, x = b.norm_with_skip(attn, x, p + "pre_feedforward_layernorm.weight")
    m = b.mlp(i, h)
    if cfg.moe_with_dense:
        e = gemma4_experts(b, i, x, b.norm(x, p + "pre_feedforward_layernorm_2.weight"))
        m = g.op("Add", [b.norm(m, p + "post_feedforward_layernorm_1.weight"),
                         b.norm(e, p + "post_feedforward_layernorm_2.weight")])
    x = g.op("Add", [x, b.norm(m, p + "post_feedforward_layernorm.weight")])
    if ple is not None:
        mine = g.op("Reshape", [g.op("Gather", [ple, g.const([i])], axis=2), g.const([0, 0, -1])])  # [B, S, P]
        gate = b.linear(x, [p + "per_layer_input_gate"], f"layers.{i}.per_layer_input_gate")
        gated = g.op("Mul", [g.op("FastGelu", [gate], domain=MS_DOMAIN), mine])
        y = b.linear(gated, [p + "per_layer_projection"], f"layers.{i}.per_layer_projection")
        x = g.op("Add", [x, b.norm(y, p + "post_per_layer_input_norm.weight")])
    if b.has(p + "layer_scalar"):
        scalar = b.tensor(p + "layer_scalar").astype(np.float32).reshape(-1)
        if not np.all(scalar == 1.0):
            x = g.op("Mul", [x, g.weight(p + "layer_scalar", scalar.astype(b.dtype))])
    return x


def gemma4_experts(b, i: int, x: str, z: str) -> str:
    """The experts' output [B, S, H]: routed from the residual x, run on their normed input z (both [B, S, H])."""
    g, cfg, p = b.g, b.cfg, f"model.layers.{i}."
    h = cfg.hidden_size
    name = f"layers.{i}.experts"
    flat_x = g.op("Reshape", [x, g.const([-1, h])])  # [N, H]
    ones = g.weight(f"ones_{h}", np.ones(h, dtype=b.dtype))
    r = g.op("SimplifiedLayerNormalization", [flat_x, ones], axis=-1, epsilon=cfg.rms_norm_eps, stash_type=1)
    proj = np.asarray(b.tensor(p + "router.proj.weight"), dtype=np.float32)  # [E, H]
    scale = np.asarray(b.tensor(p + "router.scale"), dtype=np.float32) * h ** -0.5  # folded into the router's columns
    logits = g.op("MatMul", [r, g.weight(name + ".router_t", (proj * scale[None]).T.astype(b.dtype))],
                  outputs=[f"{name}.router_logits"])  # [N, E]
    top, ids = g.op("TopK", [g.op("Softmax", [logits], axis=-1), g.const([cfg.experts_per_token])], outputs=2,
                    axis=-1)  # [N, k]
    top = g.op("Div", [top, g.op("ReduceSum", [top, g.const([-1])], keepdims=1)])
    per_expert = b.param(p + "router.per_expert_scale")  # [E]
    top = g.op("Mul", [top, g.op("Gather", [per_expert, ids], axis=0)])
    flat_z = g.op("Reshape", [z, g.const([-1, h])])
    if b.opts.device != "cpu":
        return g.op("Reshape", [_gathered_experts(b, i, flat_z, ids, top, name), g.op("Shape", [z])])
    own = file_experts(b, [(f"{p}experts.{e}.gate_up_proj.weight", f"{p}experts.{e}.down_proj.weight")
                           for e in range(cfg.num_experts)])
    if own is not None:  # a GGUF's own blocks in specrt's MoE operator (convert/ggml_experts.py): no If per expert
        return g.op("Reshape", [ggml_experts(b, own, flat_z, ids, top, "gelu_tanh", name), g.op("Shape", [z])])
    dense = g.op("ScatterElements", [g.op("Mul", [logits, g.const(0.0, dtype=b.dtype)]), ids, top], axis=1)  # [N, E]
    return g.op("Reshape", [_experts_body(b, i, flat_z, dense, name), g.op("Shape", [z])])


def _experts_body(b, i: int, z: str, weights: str, name: str) -> str:
    """z [c, H], weights [c, E] (zero where a token did not choose the expert) -> sum over experts [c, H]."""
    g, cfg = b.g, b.cfg
    width = cfg.moe_intermediate_size
    zero = g.const(0.0, dtype=b.dtype)
    outs = []
    for e in range(cfg.num_experts):
        q = f"model.layers.{i}.experts.{e}."
        column = g.op("Gather", [weights, g.const([e])], axis=1)  # [c, 1]
        chosen = g.op("Greater", [g.op("ReduceMax", [column], keepdims=0), zero])
        then_nodes: list = []
        with captured(g, then_nodes):
            gate_up = b.linear(z, [q + "gate_up_proj"], f"{name}.{e}.gate_up")
            gate, up = g.op("Split", [gate_up, g.const([width, width])], outputs=2, axis=-1)
            act = g.op("Mul", [g.op("FastGelu", [gate], domain=MS_DOMAIN), up])
            y = g.op("Mul", [b.linear(act, [q + "down_proj"], f"{name}.{e}.down"), column])
        else_out = g.fresh(f"{name}.{e}.none")
        else_nodes = [helper.make_node("Constant", [], [else_out], value=helper.make_tensor(
            else_out + ".value", b.elem, [1, 1], [0.0]))]
        outs.append(g.op("If", [chosen], name=f"{name}.{e}",
                         then_branch=helper.make_graph(then_nodes, f"{name}.{e}.then", [],
                                                       [helper.make_tensor_value_info(y, b.elem, None)]),
                         else_branch=helper.make_graph(else_nodes, f"{name}.{e}.else", [],
                                                       [helper.make_tensor_value_info(else_out, b.elem, None)])))
    return g.op("Sum", outs)


def _gathered_experts(b, i: int, z: str, ids: str, top: str, name: str) -> str:
    """A GPU graph's experts: z [N, H], ids [N, k] int64 (each token's chosen experts), top [N, k] (their routing
    weights, per-expert scales in) -> sum over k of top * down(gelu_tanh(gate) * up) [N, H]."""
    g, cfg = b.g, b.cfg
    width = cfg.moe_intermediate_size
    p = f"model.layers.{i}.experts."
    gate_up = _gathered(b, [f"{p}{e}.gate_up_proj.weight" for e in range(cfg.num_experts)], ids,
                        f"{name}.gate_up")  # [N, k, 2I, H]
    column = g.const([3])
    h = g.op("Squeeze", [g.op("MatMul", [gate_up, g.op("Unsqueeze", [z, g.const([1, 3])])]), column])  # [N, k, 2I]
    gate, up = g.op("Split", [h, g.const([width, width])], outputs=2, axis=-1)
    act = g.op("Mul", [g.op("FastGelu", [gate], domain=MS_DOMAIN), up])  # [N, k, I]
    down = _gathered(b, [f"{p}{e}.down_proj.weight" for e in range(cfg.num_experts)], ids,
                     f"{name}.down")  # [N, k, H, I]
    y = g.op("Squeeze", [g.op("MatMul", [down, g.op("Unsqueeze", [act, column])]), column])  # [N, k, H]
    weighted = g.op("Mul", [y, g.op("Unsqueeze", [top, g.const([2])])])
    return g.op("ReduceSum", [weighted, g.const([1])], keepdims=0)  # [N, H]


def _gathered(b, names: list[str], ids: str, out_name: str) -> str:
    """The experts' weights `names` (each [R, K], HF layout) stacked [E, R, K] and looked up by ids [N, k] ->
    [N, k, R, K] in the graph's float type: GatherBlockQuantized over their MatMulNBits blocks when quantized (GGUF
    formats with per-block minimums less them), a Gather from the float stack otherwise."""
    g = b.g
    experts = len(names)
    if not b.opts.bits:
        stack = np.stack([np.asarray(b.tensor(n), dtype=np.float32) for n in names]).astype(b.dtype)
        return g.op("Gather", [g.weight(out_name + ".weight", stack), ids], axis=0)
    parts = [b.quantize(n) for n in names]
    if not same_form(parts):
        raise SpecrtError(f"{out_name}: the experts' weights differ in quantized form (a GGUF mixing formats across "
                          "experts), which one gathered lookup cannot hold; convert at --precision int4 or int8")
    rows, block = parts[0].n, parts[0].block_size
    q = concat_rows(parts)
    del parts
    data = g.weight(out_name + ".qweight", q.packed.reshape(experts, rows, -1))  # [E, R, K * bits / 8] (blocks padded)
    scales = g.weight(out_name + ".scales", q.scales.reshape(experts, rows, -1).astype(b.dtype))  # [E, R, blocks]
    zero_points = g.weight(out_name + ".zero_points", q.zero_points.reshape(experts, rows, -1))
    mins = "" if q.mins is None else g.weight(out_name + ".mins", q.mins.reshape(experts, rows, -1).astype(b.dtype))
    for e, n in enumerate(names):
        b.quant_rows[n] = QuantRows(data, scales, zero_points, e * rows, (e + 1) * rows, q.n, q.k, block, q.bits,
                                    mins=mins, mins_by_row=True)
    out = g.op("GatherBlockQuantized", [data, ids, scales, zero_points], domain=MS_DOMAIN, gather_axis=0,
               quantize_axis=2, block_size=block, bits=q.bits)  # [N, k, R, blocks * block]
    if mins:  # each block of a row less its minimum
        per_block = g.op("Unsqueeze", [g.op("Gather", [mins, ids], axis=0), g.const([-1])])  # [N, k, R, blocks, 1]
        blocks = g.op("Reshape", [out, g.const([0, 0, 0, -1, block])])
        out = g.op("Reshape", [g.op("Sub", [blocks, per_block]), g.const([0, 0, 0, -1])])
    if q.k % block:  # the last block's padding
        out = g.op("Slice", [out, g.const([0]), g.const([q.k]), g.const([-1])])
    return out
