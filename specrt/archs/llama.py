"""Llama 2/3 and Mistral (SmolLM2 is a Llama): pre-norm blocks, SwiGLU MLPs, rotary embeddings (llama3 and linear
scaling); Mistral's sliding window on every layer. In GGUF, llama.cpp's converter permuted the q and k rows into
interleaved rotary pairs: undone here."""

from __future__ import annotations

import functools

from specrt.errors import SourceError
from specrt.models.config import ModelConfig, dense_config


def config_from_hf(hf: dict) -> ModelConfig:
    mistral = hf["model_type"] == "mistral"
    return dense_config(hf, sliding_default=mistral, window_everywhere=mistral)


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.transformer import LlamaBlock

    return LlamaBlock(cfg, layer)


def gguf_undo(name: str, shape: tuple, hf: dict, gguf_name: str):
    """q and k (weights and biases): llama.cpp's rotary permutation of their rows, undone (a row reordering)."""
    from specrt.models.gguf_loader import unpermute

    if not name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
        return None
    heads = hf["num_attention_heads"] if ".q_proj." in name else hf.get("num_key_value_heads",
                                                                       hf["num_attention_heads"])
    if name.endswith(".weight") and shape[0] % (2 * heads):
        raise SourceError(f"tensor {gguf_name} has {shape[0]} rows, which {heads} heads of an even width "
                          f"cannot split (GGUF metadata attention.head_count / head_count_kv)")
    return functools.partial(unpermute, n_head=heads), False
