"""LFM2's gated short convolution, a token mixer beside attention (the torch reference).

  B, C, x = split(in_proj(h))                 [B, S, H] each
  y_t = sum_k W[:, k] * (B x)_{t - (K - 1) + k}   (a causal depthwise conv of kernel K over B * x)
  out = out_proj(C * y)

Its state is the last K - 1 values of B * x per channel, [B, K - 1, H] (oldest first): the same conv state a Gated
DeltaNet layer keeps (bundle.RecurrentStates without a recurrent part), so the runtime rolls it back the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from specrt.models.config import ModelConfig
from specrt.models.moe import SparseMoE
from specrt.models.transformer import MLP, RMSNorm


class ShortConv(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, self.kernel = cfg.hidden_size, cfg.linear_conv_kernel
        self.in_proj = nn.Linear(h, 3 * h, bias=False)
        self.conv = nn.Conv1d(h, h, self.kernel, groups=h, bias=False)  # weight [H, 1, K]
        self.out_proj = nn.Linear(h, h, bias=False)

    def forward(self, x, state):
        # x [B, S, H]; state [B, K - 1, H] (or empty: zeros) -> out [B, S, H], the new state
        b, s, h = x.shape
        gate_b, gate_c, value = self.in_proj(x).chunk(3, dim=-1)
        bx = gate_b * value
        if state.numel() == 0:
            state = bx.new_zeros(b, self.kernel - 1, h)
        z = torch.cat((state.to(bx.dtype), bx), dim=1)  # [B, K - 1 + S, H]
        w = self.conv.weight[:, 0]  # [H, K]
        y = sum(z[:, k:k + s] * w[:, k] for k in range(self.kernel))
        return self.out_proj(gate_c * y), z[:, s:]


class ShortConvBlock(nn.Module):
    """Pre-norm block whose token mixer is ShortConv; forward(x, position_ids, past_a, past_b, mask) -> (x, a, b)
    as the other blocks, with past_a the conv state and a the new one (b: unused, empty)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.conv = ShortConv(cfg)
        self.mlp = SparseMoE(cfg) if cfg.is_moe(layer) else MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)

    def forward(self, x, position_ids, past_a, past_b, mask):
        a, state = self.conv(self.input_layernorm(x), past_a)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), state, past_b[..., :0]
