"""A gated short convolution (LFM2's conv layers, models/short_conv.py) in the target graph.

in_proj gives B, C and x; CausalConvWithState (no activation, channels last) runs the depthwise conv over B * x with
the conv state; out_proj(C * conv). Names as bundle.RecurrentStates lists them for a layer without a recurrent part:

inputs   past_conv.{i} [B, K - 1, H]
outputs  present_conv.{i} (the last K - 1 conv inputs after the call) and capture_conv.{i} [B, S, H] (the call's
         conv inputs: with the state before the call they give the state after any prefix of it)
"""

from __future__ import annotations

import numpy as np

from specrt.convert.onnx_graph import MS_DOMAIN


def short_conv(builder, i: int, h: str) -> str:
    """Layer i's short convolution on the normed hidden states h [B, S, H]; returns its output [B, S, H]."""
    cfg, g, p = builder.cfg, builder.g, f"model.layers.{i}.conv."
    width, kernel = cfg.hidden_size, cfg.linear_conv_kernel
    mixed = builder.linear(h, [p + "in_proj"], f"layers.{i}.in_proj")  # [B, S, 3H]
    gate_b, gate_c, x = g.op("Split", [mixed, g.const([width, width, width])], outputs=3, axis=-1)
    bx = g.op("Mul", [gate_b, x], outputs=[f"capture_conv.{i}"])  # the conv's inputs, captured as they are
    weight = builder.tensor(p + "conv.weight").astype(np.float32).reshape(width, 1, kernel)
    conv, _ = g.op("CausalConvWithState", [bx, g.weight(p + "conv.weight", weight.astype(builder.dtype)), "",
                                           f"past_conv.{i}"],
                   outputs=[f"layers.{i}.conv", f"present_conv.{i}"], domain=MS_DOMAIN, activation="none",
                   channels_last=1)
    gated = g.op("Mul", [gate_c, conv])
    return builder.linear(gated, [p + "out_proj"], f"layers.{i}.out_proj")

