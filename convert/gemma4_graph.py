"""The parts of a Gemma 4 target graph that other families lack (models/gemma4.py is the reference).

per_layer_inputs: E2B/E4B's per-layer input embeddings, every layer's [B, S, L, P] from the token ids and the scaled
embeddings; gemma4_layer_rest: a layer after its attention (sandwich norms, the dense MLP and, in MoE models, the
experts beside it, the per-layer input, the layer scalar). The attention itself (own head sizes per layer kind,
weightless value norms, keys as values, layers that read another's cache) is the target builder's
gemma4_attention.
"""

from __future__ import annotations

import math

import numpy as np

from specrt.convert.onnx_graph import MS_DOMAIN

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
        from specrt.convert.moe_graph import gemma4_experts

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
