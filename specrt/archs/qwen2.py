"""Qwen2 / Qwen2.5 and MiMo (Qwen2 blocks, plus MTP layers: models/mtp.py): the Llama layout with biases on the q,
k and v projections (a qwen2 GGUF has them where its attn_q.bias is stored)."""

from __future__ import annotations

from specrt.models.config import ModelConfig, dense_config


def config_from_hf(hf: dict) -> ModelConfig:
    return dense_config(hf, qkv_bias=True)


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.transformer import LlamaBlock

    return LlamaBlock(cfg, layer)


def gguf_fixups(reader, hf: dict, names: set[str], blocks: set[int]) -> None:
    hf["attention_bias"] = "blk.0.attn_q.bias" in names
