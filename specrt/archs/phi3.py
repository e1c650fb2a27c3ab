"""Phi-3 / Phi-3.5-mini / Phi-4-mini: Llama blocks with one fused qkv_proj (q rows, then k, then v) and one fused
gate_up_proj (gate rows, then up), split into the Llama names when read; partial rotary (Phi-4-mini turns 96 of
128 channels) with LongRoPE: each frequency divided by a factor of its own, the short factors within
original_max_position_embeddings, the long ones beyond it, cos and sin scaled by sqrt(1 + ln s / ln original)
(s = max positions / original). A bundle uses one set for all its positions (models/config.py RopeConfig.for_context,
llama.cpp's choice). llama.cpp's phi3 layout keeps the fused tensors (attn_qkv, ffn_up) as they are and stores the
factors as rope_factors_short / rope_factors_long; it leaves sliding windows off for Phi, and so does a GGUF here."""

from __future__ import annotations

import math

from specrt.errors import SourceError
from specrt.models.config import ModelConfig, RopeConfig, dense_config, rope_from_hf, sizes
from specrt.models.gguf_loader import LLAMA_BLOCK_TENSORS, common_config, field_value, tensor_data

GGUF_BLOCK_TENSORS = {**LLAMA_BLOCK_TENSORS, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
LONGROPE = ("longrope", "su")  # "su": the older configs' name


def config_from_hf(hf: dict) -> ModelConfig:
    _, _, _, head_dim = sizes(hf)
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    partial = float(hf.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0)
    if not 0 < partial <= 1:
        raise SourceError(f"config: partial_rotary_factor = {partial} must be in (0, 1]")
    rotary = int(head_dim * partial)
    kind = params.get("rope_type") or params.get("type") or "default"
    rope = _longrope(hf, params, rotary) if kind in LONGROPE else rope_from_hf(
        hf, params if "rope_theta" in params else None)
    window = int(hf.get("sliding_window") or 0)
    # transformers slides every layer's window where one is set; one beyond the model's positions never does
    slides = 0 < window < int(hf.get("max_position_embeddings", 4096))
    return dense_config({**hf, "sliding_window": window if slides else 0}, window_everywhere=slides, rope=rope,
                        partial_rotary=partial)


def _longrope(hf: dict, params: dict, rotary: int) -> RopeConfig:
    max_pos = int(hf.get("max_position_embeddings", 4096))
    original = int(hf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
                   or max_pos)
    factor = float(params.get("factor") or max_pos / original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    lists = {}
    for key in ("short_factor", "long_factor"):
        values = params.get(key)
        if (not isinstance(values, list) or len(values) != rotary // 2
                or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)):
            raise SourceError(f"config: rope {key} must list {rotary // 2} positive numbers (half the rotary size)")
        lists[key] = tuple(float(v) for v in values)
    return RopeConfig(theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))), scaling_type="longrope",
                      original_max_position=original, attention_factor=float(attention), **lists)


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.transformer import LlamaBlock

    return LlamaBlock(cfg, layer)


def hf_refs(refs: dict, hf: dict) -> dict:
    """qkv_proj and gate_up_proj read as their parts (each a range of the fused matrix's rows, read on its own)."""
    from specrt.models.config import config_from_hf

    cfg = config_from_hf(hf)
    q, kv, width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    out = {}
    for name, ref in refs.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            _check_rows(ref, q + 2 * kv)
            base = name[:-len("qkv_proj.weight")]
            out.update({base + "q_proj.weight": ref.rows(0, q), base + "k_proj.weight": ref.rows(q, kv),
                        base + "v_proj.weight": ref.rows(q + kv, kv)})
        elif name.endswith("mlp.gate_up_proj.weight"):
            _check_rows(ref, 2 * width)
            base = name[:-len("gate_up_proj.weight")]
            out.update({base + "gate_proj.weight": ref.rows(0, width), base + "up_proj.weight": ref.rows(width, width)})
        else:
            out[name] = ref
    return out


def _check_rows(ref, rows: int) -> None:
    if len(ref.shape) != 2 or ref.shape[0] != rows:
        raise SourceError(f"tensor {ref.name} has shape {list(ref.shape)}, but the config implies {rows} rows")


def gguf_config(reader, name: str) -> dict:
    """The common keys, the rotary size (rope.dimension_count) and LongRoPE (the factor tensors and
    rope.scaling.attn_factor / original_context_length); no sliding window (llama.cpp turns it off for Phi)."""
    hf = common_config(reader, name)
    hf.pop("sliding_window", None)
    heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
    head_dim = hf.get("head_dim") or (hidden // heads if isinstance(heads, int) and heads > 0 and
                                      isinstance(hidden, int) else None)
    rotary = field_value(reader, f"{name}.rope.dimension_count")
    if rotary is not None and head_dim:
        hf["partial_rotary_factor"] = int(rotary) / head_dim
    original = field_value(reader, f"{name}.rope.scaling.original_context_length")
    if original is not None:
        hf["original_max_position_embeddings"] = int(original)
    short, long = tensor_data(reader, "rope_factors_short.weight"), tensor_data(reader, "rope_factors_long.weight")
    if long is not None:
        params = {"rope_type": "longrope", "rope_theta": float(hf.get("rope_theta", 10000.0)),
                  "short_factor": [float(v) for v in (short if short is not None else long).reshape(-1)],
                  "long_factor": [float(v) for v in long.reshape(-1)]}
        attention = field_value(reader, f"{name}.rope.scaling.attn_factor")
        if attention is not None:
            params["attention_factor"] = float(attention)
        hf["rope_parameters"] = params
    return hf


gguf_split = hf_refs  # llama.cpp keeps the fused tensors as they are: split the same way
