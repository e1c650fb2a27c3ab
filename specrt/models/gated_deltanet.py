"""Qwen3.5 / 3.6 hybrid blocks, written for export and as the reference the ONNX graph is held to.

Three of every four layers are Gated DeltaNet linear attention (Yang et al., "Gated Delta Networks", 2024, as
Qwen3.5 uses it): in_proj_qkv -> a depthwise causal conv (kernel 4, SiLU) -> query/key L2-normalized per head ->
the gated delta rule over a recurrent state, with decay g = -exp(A_log) * softplus(a + dt_bias) and update rate
beta = sigmoid(b), per value head -> an RMSNorm per head gated by silu(z) -> out_proj. The other layers are full
attention with an output gate (models/transformer.py, `attn_output_gate`). Both sit in a pre-norm block with
(1 + w) norms. Parameter names follow HF (`model.layers.{i}.linear_attn.in_proj_qkv.weight`, ...).

State per linear layer, in ONNX Runtime's GatedDeltaNet layout so the graph's states are the reference's:
conv [B, K - 1, C] (the last K - 1 conv inputs, channels last; C = 2 * key heads * key dim + value heads * value
dim) and
recurrent [B, Hv, Dv, Dk] (value-major). Empty tensors (any dimension 0) stand for a zero state.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from specrt.models.config import ModelConfig
from specrt.models.moe import SparseMoE
from specrt.models.transformer import MLP, Attention, RMSNorm


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last axis (the form FLA and HF's Qwen3.5 use)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_rule(q, k, v, g, beta, state):
    """The recurrence, token by token. q, k [B, S, Hv, Dk] (already repeated to value heads, normalized, q scaled);
    v [B, S, Hv, Dv]; g (log decay), beta [B, S, Hv]; state [B, Hv, Dv, Dk]. Returns out [B, S, Hv, Dv] and the
    final state [B, Hv, Dv, Dk]."""
    s = state.transpose(-1, -2).float()  # [B, Hv, Dk, Dv]
    outs = []
    for t in range(q.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        remembered = (s * k[:, t, ..., None]).sum(-2)  # [B, Hv, Dv]
        delta = (v[:, t] - remembered) * beta[:, t, :, None]
        s = s + k[:, t, ..., None] * delta[..., None, :]
        outs.append((s * q[:, t, ..., None]).sum(-2))
    return torch.stack(outs, dim=1), s.transpose(-1, -2).contiguous()


class GatedRMSNorm(nn.Module):
    """RMSNorm over a head's values (plain weight, not 1 + w), times silu(gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, gate):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf.to(x.dtype) * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, c = cfg.hidden_size, cfg.conv_channels
        self.key_dim = cfg.linear_key_heads * cfg.linear_key_dim
        self.value_dim = cfg.linear_value_heads * cfg.linear_value_dim
        self.in_proj_qkv = nn.Linear(h, c, bias=False)
        self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(h, cfg.linear_value_heads, bias=False)
        self.in_proj_a = nn.Linear(h, cfg.linear_value_heads, bias=False)
        self.conv1d = nn.Conv1d(c, c, cfg.linear_conv_kernel, groups=c, bias=False, padding=cfg.linear_conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(cfg.linear_value_heads))
        self.A_log = nn.Parameter(torch.zeros(cfg.linear_value_heads))
        self.norm = GatedRMSNorm(cfg.linear_value_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def empty_state(self, batch: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        conv = torch.zeros(batch, cfg.linear_conv_kernel - 1, cfg.conv_channels, dtype=like.dtype)
        rec = torch.zeros(batch, cfg.linear_value_heads, cfg.linear_value_dim, cfg.linear_key_dim, dtype=torch.float32)
        return conv, rec

    def forward(self, x, conv_state, rec_state):
        # x [B, S, H]; conv_state [B, K - 1, C]; rec_state [B, Hv, Dv, Dk] (empty tensors: zero states)
        cfg = self.cfg
        b, s, _ = x.shape
        if conv_state.numel() == 0 or rec_state.numel() == 0:
            conv_state, rec_state = self.empty_state(b, x)
        mixed = torch.cat((conv_state, self.in_proj_qkv(x)), dim=1).transpose(1, 2)  # [B, C, K - 1 + S]
        new_conv = mixed[:, :, -(cfg.linear_conv_kernel - 1):].transpose(1, 2).contiguous()  # [B, K - 1, C]
        conv = F.silu(F.conv1d(mixed, self.conv1d.weight, groups=cfg.conv_channels))  # [B, C, S]
        q, k, v = conv.transpose(1, 2).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(b, s, cfg.linear_key_heads, cfg.linear_key_dim)
        k = k.reshape(b, s, cfg.linear_key_heads, cfg.linear_key_dim)
        v = v.reshape(b, s, cfg.linear_value_heads, cfg.linear_value_dim)
        groups = cfg.linear_value_heads // cfg.linear_key_heads  # each key head serves `groups` value heads
        q = l2_normalize(q.float()).repeat_interleave(groups, dim=2) * cfg.linear_key_dim ** -0.5
        k = l2_normalize(k.float()).repeat_interleave(groups, dim=2)
        beta = torch.sigmoid(self.in_proj_b(x).float())  # [B, S, Hv]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        out, new_rec = gated_delta_rule(q, k, v.float(), g, beta, rec_state)
        z = self.in_proj_z(x).reshape(b, s, cfg.linear_value_heads, cfg.linear_value_dim)
        out = self.norm(out.to(x.dtype), z).reshape(b, s, self.value_dim)
        return self.out_proj(out), new_conv, new_rec


class HybridBlock(nn.Module):
    """Pre-norm block whose token mixer is Gated DeltaNet (linear layers) or gated full attention.

    forward(x, position_ids, past_a, past_b, mask) -> (x, a, b) as the other blocks: for attention layers a, b
    are the new keys/values [B, KV, S, D] (past_a/past_b the past ones); for linear layers past_a/past_b are the
    (conv, recurrent) state and a, b the new state (the mask is not read: the recurrence is causal)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.linear = cfg.is_linear(layer)
        if self.linear:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg, layer)
        self.mlp = SparseMoE(cfg) if cfg.is_moe(layer) else MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)

    def forward(self, x, position_ids, past_a, past_b, mask):
        h = self.input_layernorm(x)
        if self.linear:
            a, new_a, new_b = self.linear_attn(h, past_a, past_b)
        else:
            a, new_a, new_b = self.self_attn(h, position_ids, past_a, past_b, mask)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), new_a, new_b
