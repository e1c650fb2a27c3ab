"""Qwen3 and Qwen3-MoE: the Llama layout with RMS norms over each head's q and k; Qwen3-MoE's MLPs are sparse
mixtures of experts (models/moe.py) except the layers mlp_only_layers keeps dense."""

from __future__ import annotations

from specrt.models.config import ModelConfig, dense_config, moe_fields, sizes


def config_from_hf(hf: dict) -> ModelConfig:
    return dense_config(hf, qk_norm=True, **moe_fields(hf, sizes(hf)[2]))


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.transformer import LlamaBlock

    return LlamaBlock(cfg, layer)


def gguf_fixups(reader, hf: dict, names: set[str], blocks: set[int]) -> None:
    """llama.cpp divides the top-k routing weights by their sum (as Qwen3-30B-A3B's config); a block without a
    router keeps a dense MLP (HF's mlp_only_layers; llama.cpp's own files have none)."""
    if hf.get("num_experts"):
        hf["norm_topk_prob"] = True
        hf["mlp_only_layers"] = sorted(i for i in blocks if f"blk.{i}.ffn_gate_inp.weight" not in names)
