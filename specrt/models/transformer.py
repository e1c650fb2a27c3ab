"""Torch reference definition of the supported decoder-only transformers, written for export.

One module covers the Llama family (pre-norm blocks: SmolLM2, Llama 2/3, Mistral, Qwen2 with qkv
bias, Qwen3 with q/k norm) and Gemma 3 (four norms per block, (1 + w) norms, scaled embeddings,
q/k norm, sliding-window and global layers with their own rope bases). Parameter names follow HF
(`model.layers.{i}.self_attn.q_proj.weight`, ...) so that an HF state dict loads unchanged.

The KV cache is explicit: `forward` takes the past keys/values of every layer and returns the
present ones, plus logits for every input position and, optionally, the residual stream after
chosen layers (the hidden-state taps that EAGLE-3, MTP and DFlash drafters read).
Attention masking is causal over past + new tokens, plus an optional additive `attention_bias`
[batch, 1, new, past + new] that a tree verification uses to hide non-ancestors.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from specrt import archs
from specrt.models.config import ModelConfig
from specrt.models.moe import SparseMoE


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (self.weight.float() + self.offset)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotary embedding (HF's rotate_half form). x [B, H, S, D]; cos/sin [B, 1, S, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        h, d = cfg.hidden_size, cfg.head_dim
        # with an output gate (Qwen3.5) each head's query is followed by its gate: [.., heads, 2 * D]
        self.q_proj = nn.Linear(h, cfg.num_heads * d * (2 if cfg.attn_output_gate else 1), bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.o_bias)
        if cfg.attention_sinks:  # gpt-oss: one logit per head that joins the softmax and is then dropped
            self.sinks = nn.Parameter(torch.zeros(cfg.num_heads))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.norm_offset)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.norm_offset)
        self.register_buffer("inv_freq", self.rotary_frequencies(), persistent=False)

    def rotary_frequencies(self) -> torch.Tensor:
        """[R/2] float64 (R = the rotary size); also recomputed by models built on the meta device (their buffers
        start empty)."""
        return torch.tensor(self.cfg.rope_for(self.layer).inv_freq(self.cfg.rotary_dim), dtype=torch.float64)

    def forward(self, x, position_ids, past_k, past_v, mask):
        # x [B, S, H]; position_ids [B, S]; past_k/v [B, KV, P, D]; mask [B, 1, S, P + S] additive
        cfg = self.cfg
        b, s, _ = x.shape
        q = self.q_proj(x)
        gate = None
        if cfg.attn_output_gate:  # [B, S, N, 2D] -> query [B, S, N, D] and gate [B, S, N * D]
            q, gate = q.view(b, s, cfg.num_heads, 2 * cfg.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(b, s, cfg.num_heads * cfg.head_dim)
        q = q.reshape(b, s, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        angles = position_ids.to(torch.float64)[..., None] * self.inv_freq  # [B, S, R/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, S, R]
        scale = cfg.rope_for(self.layer).attention_factor  # yarn: cos and sin scaled alike
        cos, sin = (angles.cos() * scale).to(x.dtype), (angles.sin() * scale).to(x.dtype)
        r = cfg.rotary_dim  # partial rotary: the first r channels turn, the rest pass through
        q = torch.cat((rotate(q[..., :r], cos, sin), q[..., r:]), dim=-1)
        k = torch.cat((rotate(k[..., :r], cos, sin), k[..., r:]), dim=-1)
        k_all = torch.cat((past_k, k), dim=2)  # [B, KV, P + S, D]
        v_all = torch.cat((past_v, v), dim=2)
        groups = cfg.num_heads // cfg.num_kv_heads
        kr = k_all.repeat_interleave(groups, dim=1)
        vr = v_all.repeat_interleave(groups, dim=1)
        scores = (q.float() @ kr.float().transpose(-1, -2)) * cfg.scale + mask  # [B, N, S, P + S]
        if cfg.attention_sinks:
            sink = self.sinks.float().reshape(1, -1, 1, 1).expand(b, -1, s, 1)
            probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1].to(x.dtype)
        else:
            probs = torch.softmax(scores, dim=-1).to(x.dtype)
        out = (probs @ vr).transpose(1, 2).reshape(b, s, cfg.num_heads * cfg.head_dim)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out), k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, width: int = 0):
        super().__init__()
        width = width or cfg.intermediate_size
        self.gate_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, cfg.hidden_size, bias=False)
        self.act = cfg.hidden_act

    def forward(self, x):
        g = self.gate_proj(x)
        g = F.silu(g) if self.act == "silu" else F.gelu(g, approximate="tanh")
        return self.down_proj(g * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = SparseMoE(cfg) if cfg.is_moe(layer) else MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)

    def forward(self, x, position_ids, past_k, past_v, mask):
        a, k, v = self.self_attn(self.input_layernorm(x), position_ids, past_k, past_v, mask)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class Gemma3Block(nn.Module):
    """Gemma 3 block: norms before and after both attention and MLP (sandwich norms)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        args = (cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.input_layernorm = RMSNorm(*args)
        self.post_attention_layernorm = RMSNorm(*args)
        self.pre_feedforward_layernorm = RMSNorm(*args)
        self.post_feedforward_layernorm = RMSNorm(*args)

    def forward(self, x, position_ids, past_k, past_v, mask):
        a, k, v = self.self_attn(self.input_layernorm(x), position_ids, past_k, past_v, mask)
        x = x + self.post_attention_layernorm(a)
        m = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(m), k, v


def block(cfg: ModelConfig, layer: int) -> nn.Module:
    """The torch module of one decoder layer, as its architecture defines it (specrt/archs/)."""
    return archs.of(cfg).module().torch_block(cfg, layer)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        if cfg.ple_size:  # Gemma 4 E2B/E4B: per-layer input embeddings (models/gemma4.per_layer_inputs)
            width = cfg.num_layers * cfg.ple_size
            self.embed_tokens_per_layer = nn.Embedding(cfg.ple_vocab, width)
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, width, bias=False)
            self.per_layer_projection_norm = RMSNorm(cfg.ple_size, cfg.rms_norm_eps, 0.0)


def causal_mask(cfg: ModelConfig, layer: int, position_ids, past_len: int, dtype=torch.float32):
    """Additive mask [B, 1, S, P + S]: new token i sees past slots and new tokens j <= i.

    Sliding-window layers see only keys less than `sliding_window` positions behind the query, the
    token itself included (HF's convention). Past slot j holds position j; new tokens hold position_ids.
    """
    b, s = position_ids.shape
    total, dev = past_len + s, position_ids.device
    q_slot = torch.arange(past_len, total, device=dev)[:, None]  # [S, 1]
    k_slot = torch.arange(total, device=dev)[None, :]  # [1, T]
    allowed = (k_slot <= q_slot).expand(b, s, total)
    if cfg.is_sliding(layer):
        k_pos = torch.cat((torch.arange(past_len, device=dev).expand(b, past_len), position_ids), dim=1)  # [B, T]
        allowed = allowed & (position_ids[:, :, None] - k_pos[:, None, :] < cfg.sliding_window)
    mask = torch.zeros(b, s, total, dtype=dtype, device=dev).masked_fill(~allowed, float("-inf"))
    return mask[:, None]


class CausalLM(nn.Module):
    """Decoder-only LM with explicit KV cache and hidden-state taps."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def empty_cache(self, batch: int = 1, dtype=torch.float32):
        """Per layer (key, value) [B, KV, 0, D]; a linear-attention layer's pair is its (conv, recurrent) state,
        empty here too (the block starts from zeros)."""
        dev = self.lm_head.weight.device
        shapes = [(batch, self.cfg.kv_heads_of(i), 0, self.cfg.head_dim_of(i)) for i in range(self.cfg.num_layers)]
        return [(torch.zeros(shape, dtype=dtype, device=dev), torch.zeros(shape, dtype=dtype, device=dev))
                for shape in shapes]

    def forward(self, input_ids, position_ids=None, past=None, attention_bias=None, hidden_layers=()):
        """input_ids [B, S]; position_ids [B, S] (default: past_len + arange(S));
        past: list per layer of (key, value) [B, KV, P, D]; attention_bias [B, 1, S, P + S] additive.
        Returns logits [B, S, V], present (past plus the new keys/values), taps [B, S, len(hidden_layers) * H].
        A tap for layer i is the residual stream after layer i (HF's hidden_states[i + 1]).
        """
        b, s = input_ids.shape
        past = past if past is not None else self.empty_cache(b)
        past_len = past[self.cfg.attention_layers[0]][0].shape[2] if self.cfg.attention_layers else 0
        if position_ids is None:
            position_ids = (torch.arange(s, device=input_ids.device) + past_len).expand(b, s)
        x = self.model.embed_tokens(input_ids)
        if self.cfg.embed_scale != 1.0:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        ple = None
        if self.cfg.ple_size:
            from specrt.models.gemma4 import per_layer_inputs

            m = self.model
            ple = per_layer_inputs(self.cfg, m.embed_tokens_per_layer(input_ids), x,
                                   m.per_layer_model_projection.weight, m.per_layer_projection_norm)
        present, taps = [], []
        for i, layer in enumerate(self.model.layers):
            mask = causal_mask(self.cfg, i, position_ids, past_len)
            if attention_bias is not None:
                mask = mask + attention_bias
            extra = {}
            if ple is not None:
                extra["per_layer_input"] = ple[:, :, i]
            source = self.cfg.kv_source(i)
            if source != i:  # reads the whole cache of an earlier layer (Gemma 4), which is also its present
                extra["shared"] = present[source]
            x, k, v = layer(x, position_ids, past[i][0], past[i][1], mask, **extra)
            if self.cfg.has_state(i):  # the block returns its new state (conv, recurrent)
                present.append((k, v))
            elif source != i:
                present.append(present[source])
            else:
                present.append((torch.cat((past[i][0], k), 2), torch.cat((past[i][1], v), 2)))
            if i in hidden_layers:
                taps.append(x)
        logits = self.lm_head(self.model.norm(x))
        if self.cfg.final_softcap:
            logits = self.cfg.final_softcap * torch.tanh(logits / self.cfg.final_softcap)
        tap = torch.cat(taps, dim=-1) if taps else None
        return logits, present, tap
