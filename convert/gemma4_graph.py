"""The parts of a Gemma 4 target graph that other families lack (models/gemma4.py is the reference).

per_layer_inputs: E2B/E4B's per-layer input embeddings, every layer's [B, S, L, P] from the token ids and the scaled
embeddings; gemma4_layer_rest: a layer after its attention (sandwich norms, the dense MLP and, in MoE models, the
experts beside it, the per-layer input, the layer scalar). The attention itself (own head sizes per layer kind,
weightless value norms, keys as values, layers that read another's cache) is the target builder's
(gemma4_qkv, then the `attention` every family shares).

Experts. Gemma 4's experts are gated GELU (down(gelu_tanh(gate) * up)); ONNX Runtime's CPU MoE / QMoE take SwiGLU
only ("FC3 is not implemented for CPU MoE"), so gemma4_experts builds them from plain ops: the router (softmax over
all experts, top k divided by their sum, times per_expert_scale) gives a dense [N, E] weight matrix, then each expert
is an If that runs its two projections (MatMulNBits over its own initializers, prepacked once) on the call's rows
only when some token of the call chose it, times its column of weights; the experts' outputs are summed in expert
order. A token's sum is then its own whatever the call's other tokens chose (an expert it did not choose adds an
exact zero), and each projection sees the call's row count as every dense projection does, so the runtime's
batch-invariant padding makes the experts exact too: no Scan over tokens (an If nested in a Scan body loses ONNX
Runtime's prepacked weights: 66 ms a layer instead of 1.3 ms at 26B-A4B's shapes, docs/perf.md).
"""

from __future__ import annotations

import math
import numpy as np
from onnx import helper

from specrt.convert.onnx_graph import MS_DOMAIN, captured

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
    dense = g.op("ScatterElements", [g.op("Mul", [logits, g.const(0.0, dtype=b.dtype)]), ids, top], axis=1)  # [N, E]
    flat_z = g.op("Reshape", [z, g.const([-1, h])])
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
