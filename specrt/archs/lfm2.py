"""LFM2 / LFM2.5 (Liquid, dense): gated short-convolution layers (models/short_conv.py, a conv state each) beside
attention layers with RMS-normed q and k, SwiGLU MLPs, the final norm named embedding_norm. Tensors are read under
the Llama names (operator_norm -> input_layernorm, ffn_norm -> post_attention_layernorm, feed_forward.w1/w3/w2 ->
mlp.gate/up/down_proj, self_attn.out_proj -> o_proj, q/k_layernorm -> q/k_norm, embedding_norm -> model.norm).
llama.cpp's lfm2 layout: shortconv.{in_proj,conv,out_proj} (conv squeezed to [H, K]), token_embd_norm as the final
norm, a per-layer head_count_kv array (0: a conv layer), shortconv.l_cache, the adjusted MLP width."""

from __future__ import annotations

from specrt.errors import SourceError
from specrt.models.config import FULL_ATTENTION, SHORT_CONV, ModelConfig, dense_config, sizes
from specrt.models.gguf_loader import LLAMA_BLOCK_TENSORS, TOP_TENSORS, common_config, field_value

RENAMES = {"operator_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
           "self_attn.out_proj": "self_attn.o_proj", "self_attn.q_layernorm": "self_attn.q_norm",
           "self_attn.k_layernorm": "self_attn.k_norm"}
GGUF_BLOCK_TENSORS = {**LLAMA_BLOCK_TENSORS, "shortconv.in_proj": "conv.in_proj", "shortconv.conv": "conv.conv",
                      "shortconv.out_proj": "conv.out_proj"}
GGUF_TOP_TENSORS = {**TOP_TENSORS, "token_embd_norm": "model.norm"}


def config_from_hf(hf: dict) -> ModelConfig:
    _, _, layers, _ = sizes(hf)
    types = hf.get("layer_types")
    if types is None:  # full_attn_idxs: the attention layers (default: all)
        full = hf.get("full_attn_idxs")
        types = [FULL_ATTENTION if full is None or i in full else SHORT_CONV for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in (SHORT_CONV, FULL_ATTENTION) for t in types):
        raise SourceError(f"config: layer_types must list {layers} layers of conv or full_attention")
    if hf.get("conv_bias"):
        raise SourceError("config: conv_bias = true is not supported (no released LFM2 has conv biases)")
    kernel = int(hf.get("conv_L_cache") or 3)
    if not 2 <= kernel <= 64:
        raise SourceError(f"config: conv_L_cache = {kernel} is out of range (2..64)")
    return dense_config({**hf, "layer_types": None}, intermediate_size=_mlp_width(hf),
                        rms_norm_eps=float(hf.get("norm_eps", 1e-5)),
                        tie_word_embeddings=bool(hf.get("tie_word_embeddings", hf.get("tie_embedding", True))),
                        qk_norm=True, layer_types=tuple(types), linear_conv_kernel=kernel)


def _mlp_width(hf: dict) -> int:
    """transformers' Lfm2MLP width: 2/3 of block_ff_dim (or intermediate_size), times the multiplier, rounded up to
    block_multiple_of, where block_auto_adjust_ff_dim says so."""
    width = int(hf.get("block_ff_dim") or hf["intermediate_size"])
    if hf.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            step = int(hf.get("block_multiple_of") or 256)
            width = int(float(multiplier) * width)
            width = step * ((width + step - 1) // step)
    return width


def torch_block(cfg: ModelConfig, layer: int):
    if cfg.is_short_conv(layer):
        from specrt.models.short_conv import ShortConvBlock

        return ShortConvBlock(cfg, layer)
    from specrt.models.transformer import LlamaBlock

    return LlamaBlock(cfg, layer)


def hf_refs(refs: dict, hf: dict) -> dict:
    """The checkpoint's tensors under the Llama names (RENAMES; model.embedding_norm is the final norm)."""
    out = {}
    for name, ref in refs.items():
        if name.startswith("model.embedding_norm."):
            name = "model.norm." + name[len("model.embedding_norm."):]
        elif name.startswith("model.layers."):
            head, _, rest = name.partition(".layers.")
            layer, _, rest = rest.partition(".")
            for old, new in RENAMES.items():
                if rest.startswith(old + "."):
                    rest = new + rest[len(old):]
                    break
            name = f"{head}.layers.{layer}.{rest}"
        out[name] = ref
    return out


def gguf_config(reader, name: str) -> dict:
    """The common keys, with head_count_kv per layer (0: a conv layer) giving the layer types; the MLP width is
    written adjusted, the conv kernel as shortconv.l_cache."""
    hf = common_config(reader, name)
    kv = hf.get("num_key_value_heads")
    if isinstance(kv, list):
        if not kv or not all(isinstance(k, int) and k >= 0 for k in kv) or not any(kv):
            raise SourceError(f"GGUF metadata {name}.attention.head_count_kv must list each layer's KV heads "
                              "(0 for a conv layer), some of them above 0")
        hf["layer_types"] = [FULL_ATTENTION if k else SHORT_CONV for k in kv]
        hf["num_key_value_heads"] = max(kv)
    kernel = field_value(reader, f"{name}.shortconv.l_cache")
    if kernel is not None:
        hf["conv_L_cache"] = int(kernel)
    hf["block_auto_adjust_ff_dim"] = False  # feed_forward_length is the width itself
    hf["norm_eps"] = hf.pop("rms_norm_eps", 1e-5)
    return hf


def gguf_split(refs: dict, hf: dict) -> dict:
    """The conv weights, stored squeezed [H, K], read as HF's [H, 1, K] (the same values in the same order)."""
    import dataclasses

    return {name: dataclasses.replace(ref, shape=(ref.shape[0], 1, ref.shape[1]))
            if name.endswith(".conv.conv.weight") and len(ref.shape) == 2 else ref for name, ref in refs.items()}
