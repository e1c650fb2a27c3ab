"""Gemma 4 text blocks (dense, E2B/E4B with per-layer embeddings and shared KV, and the MoE variant), written as
the reference the ONNX graph is held to, in HF's parameter names.

A layer: x + post_attn_norm(attn(input_norm(x))), then x + post_ff_norm(mlp(pre_ff_norm(x))) (MoE layers: the
dense MLP's output normed plus the experts' output normed), then per-layer input embeddings (PLE): x +
post_ple_norm(proj(gelu(gate(x)) * ple_i)), then x * layer_scalar. Every norm multiplies by w (not 1 + w); values
are RMS-normalized without a weight; the attention scale is 1 (q and k are normed); full layers have their own head
size and KV heads, may take their values from the key projection (k_eq_v), and turn a quarter of their channel pairs
(proportional rope). The last `kv_shared_layers` layers compute no keys or values: they attend over the cache of
the last earlier layer of their kind (ModelConfig.kv_source).

PLE (ple_size P > 0): per token and layer i, ple_i = (RMS_w(E x W_plm^T / sqrt(H)) + E_ple[id] * sqrt(P)) / sqrt(2)
over P channels, where E x is the scaled token embedding; `per_layer_inputs` computes all layers' at once [B, S, L, P].
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn
import torch.nn.functional as F

from specrt.errors import SourceError
from specrt.models.config import ModelConfig
from specrt.models.moe import ExpertChoice
from specrt.models.transformer import MLP, RMSNorm, rotate


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalization without a weight (Gemma 4's value and router norms), in float32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Gemma4Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        h, d, kv = cfg.hidden_size, cfg.head_dim_of(layer), cfg.kv_heads_of(layer)
        self.d, self.kv = d, kv
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, 0.0)
        self.reads_shared = cfg.kv_source(layer) != layer
        if not self.reads_shared:
            self.k_proj = nn.Linear(h, kv * d, bias=cfg.qkv_bias)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, 0.0)
            if not cfg.k_eq_v(layer):
                self.v_proj = nn.Linear(h, kv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.qkv_bias)
        self.register_buffer("inv_freq", self.rotary_frequencies(), persistent=False)

    def rotary_frequencies(self) -> torch.Tensor:
        """[D/2] float64 (recomputed by modules built on the meta device)."""
        return torch.tensor(self.cfg.rope_for(self.layer).inv_freq(self.d), dtype=torch.float64)

    def forward(self, x, position_ids, past_k, past_v, mask, shared=None):
        """x [B, S, H]; past_k/v [B, KV, P, D]; mask [B, 1, S, P + S]; shared: (keys, values) [B, KV, P + S, D] of
        the layer this one reads (its source's whole cache, new tokens included). Returns the output [B, S, H] and
        this layer's new keys and values [B, KV, S, D] (None when it reads another's)."""
        cfg, d = self.cfg, self.d
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, cfg.num_heads, d)).transpose(1, 2)  # [B, N, S, D]
        angles = position_ids.to(torch.float64)[..., None] * self.inv_freq  # [B, S, D/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, S, D]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        q = rotate(q, cos, sin)
        k = v = None
        if shared is not None:
            k_all, v_all = shared
        else:
            raw = self.k_proj(x).view(b, s, self.kv, d)
            v = (self.v_proj(x).view(b, s, self.kv, d) if hasattr(self, "v_proj") else raw)
            v = rms(v, cfg.rms_norm_eps).transpose(1, 2)  # [B, KV, S, D]
            k = rotate(self.k_norm(raw).transpose(1, 2), cos, sin)
            k_all, v_all = torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)
        groups = cfg.num_heads // self.kv
        kr, vr = k_all.repeat_interleave(groups, dim=1), v_all.repeat_interleave(groups, dim=1)
        scores = (q.float() @ kr.float().transpose(-1, -2)) * cfg.scale_of(self.layer) + mask  # [B, N, S, T]
        probs = torch.softmax(scores, dim=-1).to(x.dtype)
        out = (probs @ vr).transpose(1, 2).reshape(b, s, cfg.num_heads * d)
        return self.o_proj(out), k, v


class Gemma4Router(nn.Module):
    """Scores experts from RMS(x) * scale / sqrt(H): softmax over all, the top k divided by their sum, times each
    chosen expert's per_expert_scale."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, e = cfg.hidden_size, cfg.num_experts
        self.top_k, self.eps, self.hidden = cfg.experts_per_token, cfg.rms_norm_eps, h
        self.proj = nn.Linear(h, e, bias=False)
        self.scale = nn.Parameter(torch.ones(h))
        self.per_expert_scale = nn.Parameter(torch.ones(e))
        self.choice = ExpertChoice()

    def forward(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """r [N, H] (the residual) -> (weights [N, k], expert ids [N, k])."""
        z = rms(r, self.eps) * self.scale * self.hidden**-0.5
        probs = torch.softmax(self.proj(z).float(), dim=-1)
        weights, ids = self.choice(probs, self.top_k)
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.per_expert_scale[ids]
        return weights.to(r.dtype), ids


class Gemma4Expert(nn.Module):
    """One expert: down(gelu_tanh(gate) * up), gate and up the halves of gate_up_proj [2I, H] (gate rows first)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.moe_intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.moe_intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(z).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma4Experts(nn.ModuleList):
    """The layer's experts, each under its own names (`experts.{e}.gate_up_proj.weight`: the checkpoint's fused
    [E, 2I, H] / [E, H, I] tensors are read an expert at a time, expert_view)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(Gemma4Expert(cfg) for _ in range(cfg.num_experts))

    def mix(self, z: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """z [N, H] (the experts' normed input); weights, ids [N, k] (the router's) -> [N, H]."""
        out = torch.zeros_like(z)
        for e in ids.unique().tolist():
            rows, slot = torch.nonzero(ids == e, as_tuple=True)
            out.index_add_(0, rows, self[e](z[rows]) * weights[rows, slot, None])
        return out


_FUSED = re.compile(r"^(model\.layers\.\d+\.experts\.)(gate_up_proj|down_proj)$")


def expert_view(refs: dict) -> dict:
    """A Gemma 4 MoE checkpoint's fused experts (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I])
    as per-expert tensors `experts.{e}.gate_up_proj.weight` [2I, H] and `experts.{e}.down_proj.weight` [H, I], each
    read from its own bytes when used (TensorRefs) or sliced (arrays); other tensors as they are."""
    out = {}
    for name, ref in refs.items():
        m = _FUSED.match(name)
        if m is None:
            out[name] = ref
            continue
        if len(ref.shape) != 3:
            raise SourceError(f"tensor {name} has shape {tuple(ref.shape)}, expected [experts, out, in]")
        for e in range(ref.shape[0]):
            key = f"{m.group(1)}{e}.{m.group(2)}.weight"
            out[key] = ref.expert(e, tuple(ref.shape[1:])) if hasattr(ref, "expert") else ref[e]
    return out


class Gemma4Block(nn.Module):
    def reset_parameters(self) -> None:  # a layer_scalar the weights lack is 1, as transformers initializes it
        nn.init.ones_(self.layer_scalar)

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.self_attn = Gemma4Attention(cfg, layer)
        self.mlp = MLP(cfg, cfg.intermediate_of(layer))
        args = (cfg.hidden_size, cfg.rms_norm_eps, 0.0)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(*args))
        self.layer_scalar = nn.Parameter(torch.ones(1))  # a buffer in HF, saved with the weights
        if cfg.ple_size:
            self.per_layer_input_gate = nn.Linear(cfg.hidden_size, cfg.ple_size, bias=False)
            self.per_layer_projection = nn.Linear(cfg.ple_size, cfg.hidden_size, bias=False)
            self.post_per_layer_input_norm = RMSNorm(*args)
        if cfg.moe_with_dense:
            self.router = Gemma4Router(cfg)
            self.experts = Gemma4Experts(cfg)
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                setattr(self, name, RMSNorm(*args))

    def forward(self, x, position_ids, past_k, past_v, mask, per_layer_input=None, shared=None):
        """x [B, S, H]; per_layer_input [B, S, P] (PLE models); shared: the source layer's (keys, values) for a layer
        that reads another's cache. Returns the new x and the layer's new keys and values (None when shared)."""
        a, k, v = self.self_attn(self.input_layernorm(x), position_ids, past_k, past_v, mask, shared)
        x = x + self.post_attention_layernorm(a)
        m = self.mlp(self.pre_feedforward_layernorm(x))
        if self.cfg.moe_with_dense:
            flat = x.reshape(-1, x.shape[-1])
            e = self.experts.mix(self.pre_feedforward_layernorm_2(flat), *self.router(flat)).reshape(x.shape)
            m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(e)
        x = x + self.post_feedforward_layernorm(m)
        if self.cfg.ple_size:
            g = F.gelu(self.per_layer_input_gate(x), approximate="tanh") * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return x * self.layer_scalar, k, v


def per_layer_inputs(cfg: ModelConfig, token_rows: torch.Tensor, embedded: torch.Tensor, projection: torch.Tensor,
                     norm: RMSNorm) -> torch.Tensor:
    """token_rows: the tokens' rows of embed_tokens_per_layer [B, S, L * P]; embedded: the scaled token embeddings
    [B, S, H]; projection: per_layer_model_projection.weight [L * P, H]. Returns every layer's input [B, S, L, P]."""
    b, s, _ = embedded.shape
    shape = (b, s, cfg.num_layers, cfg.ple_size)
    context = norm((F.linear(embedded, projection) * cfg.hidden_size**-0.5).reshape(shape))
    tokens = token_rows.reshape(shape) * torch.tensor(math.sqrt(cfg.ple_size), dtype=token_rows.dtype)
    return (context + tokens) * 2**-0.5


def softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(logits / cap) (Gemma's final logit soft-capping); unchanged when cap is 0."""
    return cap * torch.tanh(logits / cap) if cap else logits
