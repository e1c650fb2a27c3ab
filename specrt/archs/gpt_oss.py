"""gpt-oss: Llama-layout attention with a learned sink logit per head and biases, even layers sliding, yarn rope;
every MLP a mixture of biased experts with a clamped SwiGLU. HF folders store the experts fused (bf16 or MXFP4:
models/gpt_oss_layout.py); llama.cpp stacks them per tensor and names the pre-MoE norm post_attention_norm."""

from __future__ import annotations

import math

from specrt.errors import SourceError
from specrt.models.config import ModelConfig, dense_config, moe_fields, sizes
from specrt.models.gguf_loader import LLAMA_BLOCK_TENSORS, field_value

GGUF_BLOCK_TENSORS = {**LLAMA_BLOCK_TENSORS, "post_attention_norm": "post_attention_layernorm"}


def config_from_hf(hf: dict) -> ModelConfig:
    # softmax over the top-k logits: the top-k of the softmax, renormalized; each expert as wide as intermediate_size
    moe = moe_fields({**hf, "moe_intermediate_size": hf.get("intermediate_size"), "norm_topk_prob": True},
                     sizes(hf)[2])
    if moe:
        limit = float(hf.get("swiglu_limit", 7.0))
        if not (math.isfinite(limit) and limit > 0):
            raise SourceError(f"config: swiglu_limit = {limit} must be finite and > 0")
        moe.update(moe_bias=True, swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)), swiglu_limit=limit,
                   swiglu_beta=1.0)
    return dense_config(hf, sliding_default=True, o_bias=bool(hf.get("attention_bias", False)),
                        attention_sinks=True, **moe)


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.transformer import LlamaBlock

    return LlamaBlock(cfg, layer)


def hf_refs(refs: dict, hf: dict) -> dict:
    """The fused (bf16 or MXFP4) experts read as per-expert tensors."""
    from specrt.models.gpt_oss_layout import expert_view

    return expert_view(refs)


def gguf_fixups(reader, hf: dict, names: set[str], blocks: set[int]) -> None:
    """Fixed by the architecture in llama.cpp: biases everywhere, even layers sliding, yarn."""
    hf["attention_bias"] = True
    hf.setdefault("intermediate_size", hf.get("moe_intermediate_size"))
    hf["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(len(blocks))]
    if field_value(reader, "gpt-oss.rope.scaling.type") == "yarn":
        hf["rope_scaling"] = {
            "rope_type": "yarn", "factor": float(field_value(reader, "gpt-oss.rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(field_value(
                reader, "gpt-oss.rope.scaling.original_context_length", 4096)),
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
