"""Gemma 3 (text): (1 + w) norms around both sublayers ("sandwich" norms), q/k head norms, gelu-tanh MLPs,
embeddings times sqrt(hidden), sliding layers with a rope of their own (5 of every 6), attention scaled by
query_pre_attn_scalar. llama.cpp stores the norms as 1 + w (undone here) and fixes the rest by the architecture."""

from __future__ import annotations

import math

from specrt.models.config import ModelConfig, RopeConfig, dense_config, rope_from_hf, sizes, text_config
from specrt.models.gguf_loader import BLOCK_TENSORS

GGUF_BLOCK_TENSORS = {**BLOCK_TENSORS, "post_attention_norm": "post_attention_layernorm",
                      "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}


def config_from_hf(hf: dict) -> ModelConfig:
    if "text_config" in hf:  # the published multimodal layout
        hf = text_config(hf, "gemma3_text", tie_default=True)
    hidden, _, layers, _ = sizes(hf)
    params = hf.get("rope_parameters")
    per_type = params if params and "full_attention" in params else None
    rope = rope_from_hf(hf, per_type["full_attention"] if per_type else None)
    local = (rope_from_hf(hf, per_type["sliding_attention"]) if per_type
             else RopeConfig(theta=float(hf.get("rope_local_base_freq", 10000.0))))
    layer_types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % int(hf.get("sliding_window_pattern", 6)) == 0 else "sliding_attention"
        for i in range(layers)]
    return dense_config(
        {**hf, "model_type": "gemma3_text"}, family="gemma3", rope=rope, local_rope=local,
        sliding_window=int(hf.get("sliding_window") or 0),
        sliding_layers=tuple(t == "sliding_attention" for t in layer_types),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)), qk_norm=True, norm_offset=1.0,
        embed_scale=math.sqrt(hidden), attn_scale=float(hf["query_pre_attn_scalar"]) ** -0.5)


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.transformer import Gemma3Block

    return Gemma3Block(cfg, layer)


def graph_layer_rest(b, i: int, x: str, attn: str, ple) -> tuple[str, str]:
    """After attention: its output normed, the residual added, the MLP between its own two norms; returns (the
    residual stream, the MLP's output still to be added)."""
    p = f"model.layers.{i}."
    attn = b.norm(attn, p + "post_attention_layernorm.weight")
    h, x = b.norm_with_skip(attn, x, p + "pre_feedforward_layernorm.weight")
    return x, b.norm(b.mlp(i, h), p + "post_feedforward_layernorm.weight")


def gguf_fixups(reader, hf: dict, names: set[str], blocks: set[int]) -> None:
    """What llama.cpp fixes by the architecture."""
    hf["hidden_activation"] = "gelu_pytorch_tanh"
    hf.setdefault("head_dim", 256)
    hf["query_pre_attn_scalar"] = hf["head_dim"]
    hf["rope_local_base_freq"] = 10000.0
    hf.setdefault("rope_theta", 1_000_000.0)
    hf["sliding_window_pattern"] = 6


def _minus_one(w):
    return w - 1.0


def gguf_undo(name: str, shape: tuple, hf: dict, gguf_name: str):
    """Norms were stored as 1 + w (elementwise)."""
    return (_minus_one, True) if "norm" in name else None
