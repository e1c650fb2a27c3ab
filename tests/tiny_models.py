"""Tiny random-weight HF models built from transformers config classes (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


def hf_config(arch: str):
    import transformers as tf

    if arch == "llama":
        return tf.LlamaConfig(**COMMON, tie_word_embeddings=False, rope_theta=10000.0)
    if arch == "qwen2":
        return tf.Qwen2Config(**COMMON, tie_word_embeddings=True, rope_theta=100000.0)
    if arch == "qwen3":
        return tf.Qwen3Config(**COMMON, tie_word_embeddings=False)
    if arch == "gemma3":
        c = dict(COMMON, num_hidden_layers=4)
        return tf.Gemma3TextConfig(
            **c,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
        )
    raise KeyError(arch)


def hf_model(arch: str, seed: int = 0):
    """A tiny HF causal LM with random weights, norms perturbed away from their defaults."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = hf_config(arch)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_hf_folder(arch: str, path: Path, seed: int = 0) -> Path:
    """Write a tiny model as an HF folder (config.json + model.safetensors), no tokenizer."""
    model = hf_model(arch, seed)
    model.save_pretrained(path, safe_serialization=True)
    return path


def read_config(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())
