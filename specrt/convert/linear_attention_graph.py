"""A Gated DeltaNet layer (models/gated_deltanet.py) in the target graph, with ONNX Runtime's fused CPU/CUDA ops.

Per layer: one fused MatMul for in_proj_qkv | in_proj_z | in_proj_b | in_proj_a; CausalConvWithState (SiLU,
channels last) over the qkv rows with the conv state; query/key L2-normalized (with HF's epsilon, outside the
op); GatedDeltaNet (decay -exp(A_log) * softplus(a + dt_bias), update rate sigmoid(b), inside the op) over the
recurrent state; an RMSNorm per value head times silu(z); out_proj. Names as specrt/bundle.RecurrentStates lists them:

inputs   past_conv.{i} [B, K - 1, C], past_recurrent.{i} [B, Hv, Dv, Dk]
outputs  present_conv.{i}, present_recurrent.{i} (the state after the call's last token),
         capture_conv.{i} [B, S, C] (the call's conv inputs) and capture_recurrent.{i} [B, capacity * (Hv + Hk *
         Dk + Hv * Dv)] (GatedDeltaNet's compact state update of the first `capacity` tokens): with the state
         before the call they give the state after any prefix of it (runtime/recurrent_state.py), so a
         speculative step keeps the accepted prefix's state without running the target again.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from specrt.bundle import CAPTURE_CAPACITY, SEQLENS_INPUT, RecurrentStates
from specrt.convert.onnx_graph import MS_DOMAIN
from specrt.models.config import ModelConfig


CAPTURE_COUNT = "capture_count"  # graph-internal [B] int32: tokens each request's GatedDeltaNet captures


def state_layout(cfg: ModelConfig) -> RecurrentStates | None:
    """The manifest's description of a hybrid model's states (None for a model without state layers): Gated
    DeltaNet layers' conv and recurrent states, or short convolutions' conv states (models/short_conv.py)."""
    if not cfg.state_layers:
        return None
    if not cfg.linear_layers:
        return RecurrentStates(layers=cfg.state_layers, conv_kernel=cfg.linear_conv_kernel,
                               conv_channels=cfg.conv_channels, value_heads=0, value_dim=0, key_heads=0, key_dim=0)
    return RecurrentStates(layers=cfg.linear_layers, conv_kernel=cfg.linear_conv_kernel,
                           conv_channels=cfg.conv_channels, value_heads=cfg.linear_value_heads,
                           value_dim=cfg.linear_value_dim, key_heads=cfg.linear_key_heads, key_dim=cfg.linear_key_dim)


def capture_width(st: RecurrentStates) -> int:
    """Floats per request in capture_recurrent: capacity x (decay [Hv] + key [Hk, Dk] + delta [Hv, Dv])."""
    return st.capacity * (st.value_heads + st.key_heads * st.key_dim + st.value_heads * st.value_dim)


def add_state_io(builder, st: RecurrentStates) -> None:
    """The state inputs of every linear layer (call before the layers; add_state_outputs after them), and the
    tokens each request captures (CAPTURE_COUNT [B], made once for every layer to read)."""
    g, elem = builder.g, TensorProto.FLOAT
    for i in st.layers:
        g.add_input(f"past_conv.{i}", builder.elem, ["batch_size", st.conv_kernel - 1, st.conv_channels])
        if st.has_recurrent:
            g.add_input(f"past_recurrent.{i}", elem, ["batch_size", *st.recurrent_shape])
    if not st.has_recurrent:
        return
    if builder.opts.device == "rocm":  # [B] from seqlens_k's rows (a rocm graph has no attention_mask)
        g.op("Add", [g.op("Mul", [SEQLENS_INPUT, g.const(0, np.int32)]), g.const(CAPTURE_CAPACITY, np.int32)],
             outputs=[CAPTURE_COUNT])
        return
    if builder.opts.device != "cpu":  # [B] from the mask's rows, not from Shape (which ONNX Runtime puts on the CPU)
        rows = g.op("ReduceMax", ["attention_mask", g.const([1])], keepdims=0)  # [B] ones
        g.op("Cast", [g.op("Mul", [rows, g.const(CAPTURE_CAPACITY)])], outputs=[CAPTURE_COUNT], to=TensorProto.INT32)
        return
    batch = g.op("Slice", [g.op("Shape", ["input_ids"]), g.const([0]), g.const([1])])  # [1]
    g.op("Expand", [g.const([CAPTURE_CAPACITY], dtype=np.int32), batch], outputs=[CAPTURE_COUNT])


def add_state_outputs(builder, st: RecurrentStates) -> None:
    g = builder.g
    for i in st.layers:
        g.add_output(f"present_conv.{i}", builder.elem, ["batch_size", st.conv_kernel - 1, st.conv_channels])
        if st.has_recurrent:
            g.add_output(f"present_recurrent.{i}", TensorProto.FLOAT, ["batch_size", *st.recurrent_shape])
        g.add_output(f"capture_conv.{i}", builder.elem, ["batch_size", "sequence_length", st.conv_channels])
        if st.has_recurrent:
            g.add_output(f"capture_recurrent.{i}", TensorProto.FLOAT, ["batch_size", capture_width(st)])


# -exp(A_log) * softplus(a + dt_bias): ONNX Runtime 1.32 calls it "softplus" and still takes "qwen", the only name
# 1.31's kernels (CUDA's included: the newest GPU wheel) know
GATE = "qwen"
L2_EPS = 1e-6  # inside the square root, as HF's Qwen3.5 and FLA normalize (the op's own qk_l2_norm uses none)


def _l2_normalize(g, x: str, dtype) -> str:
    """x * rsqrt(sum(x^2) + 1e-6) over the last axis (x of numpy dtype `dtype`)."""
    squares = g.op("ReduceSumSquare", [x, g.const([-1])], keepdims=1)
    return g.op("Mul", [x, g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [squares, g.const(L2_EPS, dtype)])])])])


def linear_attention(builder, i: int, h: str) -> str:
    """Layer i's Gated DeltaNet on the normed hidden states h [B, S, H]; returns its output [B, S, H]."""
    cfg, g, p = builder.cfg, builder.g, f"model.layers.{i}.linear_attn."
    hk, hv, dk, dv = cfg.linear_key_heads, cfg.linear_value_heads, cfg.linear_key_dim, cfg.linear_value_dim
    channels, value_dim = cfg.conv_channels, hv * dv
    names = [p + "in_proj_qkv", p + "in_proj_z", p + "in_proj_b", p + "in_proj_a"]
    mixed = builder.linear(h, names, f"layers.{i}.in_proj")  # [B, S, C + Hv * Dv + 2 * Hv]
    qkv, z, b, a = g.op("Split", [mixed, g.const([channels, value_dim, hv, hv])], outputs=4, axis=-1)
    g.op("Identity", [qkv], outputs=[f"capture_conv.{i}"])
    weight = builder.tensor(p + "conv1d.weight").astype(np.float32).reshape(channels, 1, cfg.linear_conv_kernel)
    conv, _ = g.op("CausalConvWithState", [qkv, g.weight(p + "conv1d.weight", weight.astype(builder.dtype)), "",
                                           f"past_conv.{i}"],
                   outputs=[f"layers.{i}.conv", f"present_conv.{i}"], domain=MS_DOMAIN, activation="silu",
                   channels_last=1)
    q, k, v = g.op("Split", [conv, g.const([hk * dk, hk * dk, value_dim])], outputs=3, axis=-1)
    q = _l2_normalize(g, g.op("Reshape", [q, g.const([0, 0, hk, dk])]), builder.dtype)  # [B, S, Hk, Dk]
    k = _l2_normalize(g, g.op("Reshape", [k, g.const([0, 0, hk, dk])]), builder.dtype)
    v = g.op("Reshape", [v, g.const([0, 0, hv, dv])])  # [B, S, Hv, Dv]
    a_log = g.weight(p + "A_log", builder.tensor(p + "A_log").astype(np.float32))
    dt_bias = g.weight(p + "dt_bias", builder.tensor(p + "dt_bias").astype(np.float32))
    if builder.dtype != np.float32:  # ONNX Runtime 1.31 (the newest GPU wheel) takes the gates in float32 only
        a, b = (g.op("Cast", [x], to=TensorProto.FLOAT) for x in (a, b))
    core = g.op("GatedDeltaNet", [q, k, v, "", a, b, f"past_recurrent.{i}", a_log, dt_bias, CAPTURE_COUNT],
                outputs=[f"layers.{i}.delta_rule", f"present_recurrent.{i}", f"capture_recurrent.{i}"],
                domain=MS_DOMAIN, gate_activation=GATE, beta_activation="sigmoid", qk_l2_norm=0,
                state_update_capacity=CAPTURE_CAPACITY)[0]  # [B, S, Hv, Dv]
    normed = g.op("SimplifiedLayerNormalization", [core, builder.param(p + "norm.weight")], axis=-1,
                  epsilon=cfg.rms_norm_eps, stash_type=1)
    z = g.op("Reshape", [z, g.const([0, 0, hv, dv])])
    gated = g.op("Mul", [normed, g.op("Mul", [z, g.op("Sigmoid", [z])])])
    return builder.linear(g.op("Reshape", [gated, g.const([0, 0, value_dim])]), [p + "out_proj"],
                          f"layers.{i}.out_proj")
