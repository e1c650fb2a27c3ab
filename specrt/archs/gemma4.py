"""Gemma 4 (text: E2B/E4B, 31B, 26B-A4B): sliding and full layers of their own head sizes (full ones with
proportional rope and keys that may be their values), weightless value norms, per-layer input embeddings, the last
layers reading earlier layers' caches, a learned scalar after each layer, soft-capped logits; the MoE variant keeps
each layer's dense MLP beside its experts. The torch reference is models/gemma4.py, the graph's parts
convert/gemma4_graph.py, llama.cpp's layout archs/gemma4_gguf.py. Gemma 4's assistant drafts for it
(models/gemma4_assistant.py)."""

from __future__ import annotations

import math
from pathlib import Path

from specrt.errors import SourceError
from specrt.models.config import LIMITS, ModelConfig, eos_ids, rope_from_hf, sizes, text_config


def config_from_hf(hf: dict) -> ModelConfig:
    """Gemma 4 (text part): sliding and full layers (full ones with their own head size, KV heads and proportional
    rope), w (not 1 + w) norms, weightless value norms, attention scale 1, a learned scalar after each layer,
    soft-capped logits, per-layer input embeddings, KV shared by the last layers; the MoE variant keeps each layer's
    dense MLP beside its experts. Full layers' sizes come from global_head_dim / num_global_key_value_heads, or from
    the per_layer_config that transformers 5.25 saves. The published multimodal layout's language model is its
    text_config."""
    if hf["model_type"] == "gemma4":
        hf = text_config(hf, "gemma4_text", tie_default=True)
    hidden, heads, layers, head_dim = sizes(hf)
    model_type = hf["model_type"]
    layer_types = list(hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)])
    if len(layer_types) != layers or any(t not in ("sliding_attention", "full_attention") for t in layer_types):
        raise SourceError(f"config: layer_types must list {layers} layers of sliding_attention or full_attention")
    layer_types[-1] = "full_attention"  # as transformers forces it
    params = hf.get("rope_parameters") or {}
    if params and not all(isinstance(params.get(t), dict) for t in ("sliding_attention", "full_attention")):
        raise SourceError("config: rope_parameters must give sliding_attention and full_attention settings")
    full_rope = rope_from_hf(hf, params.get("full_attention") or {
        "rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6})
    local_rope = rope_from_hf(hf, params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 1e4})
    k_eq_v = bool(hf.get("attention_k_eq_v", False))
    full_dim, full_kv = int(hf.get("global_head_dim") or 512), hf.get("num_global_key_value_heads") if k_eq_v else None
    per_layer = hf.get("per_layer_config")
    if per_layer is not None:
        if not isinstance(per_layer, dict):
            raise SourceError("config: per_layer_config must be an object")
        full_dim, full_kv = head_dim, None
        for key, over in per_layer.items():
            if not isinstance(over, dict) or not str(key).isdigit() or not 0 <= int(key) < layers:
                raise SourceError(f"config: per_layer_config has an entry {key!r} that is not a layer's settings")
            if layer_types[int(key)] == "full_attention":
                full_dim = int(over.get("head_dim", full_dim))
                full_kv = over.get("num_key_value_heads", full_kv)
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    shared = int(hf.get("num_kv_shared_layers") or 0)
    if not 0 <= shared < layers:
        raise SourceError(f"config: num_kv_shared_layers = {shared} must be below num_hidden_layers ({layers})")
    if shared and {*layer_types[layers - shared:]} - {*layer_types[:layers - shared]}:
        raise SourceError("config: a layer kind that shares KV has no earlier layer of its kind that keeps its own")
    act = hf.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise SourceError(f"unsupported activation {act!r} for gemma4 (supported: gelu_pytorch_tanh)")
    moe = {}
    if hf.get("enable_moe_block"):
        experts, top_k = int(hf.get("num_experts") or 0), int(hf.get("top_k_experts") or 0)
        width = int(hf.get("moe_intermediate_size") or 0)
        if not 1 <= experts <= 1 << 16 or not 1 <= top_k <= experts:
            raise SourceError(f"config: num_experts = {experts} / top_k_experts = {top_k} are out of range")
        if not 1 <= width <= LIMITS["intermediate_size"]:
            raise SourceError(f"config: moe_intermediate_size = {width} is out of range")
        moe = dict(num_experts=experts, experts_per_token=top_k, moe_intermediate_size=width, norm_topk_prob=True,
                   moe_with_dense=True)
    softcap = float(hf.get("final_logit_softcapping") or 0.0)
    if not (math.isfinite(softcap) and softcap >= 0):
        raise SourceError(f"config: final_logit_softcapping = {softcap} must be finite and >= 0")
    ple = int(hf.get("hidden_size_per_layer_input", 256) or 0)
    cfg = ModelConfig(
        model_type=model_type, family="gemma4", vocab_size=int(hf["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]), num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position=int(hf.get("max_position_embeddings", 131072)), rope=full_rope,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)), qkv_bias=bool(hf.get("attention_bias", False)),
        qk_norm=True, norm_offset=0.0, hidden_act="gelu_tanh", embed_scale=math.sqrt(hidden), attn_scale=1.0,
        sliding_window=int(hf.get("sliding_window") or 512),
        sliding_layers=tuple(t == "sliding_attention" for t in layer_types), local_rope=local_rope,
        bos_token_id=hf.get("bos_token_id"), eos_token_ids=eos_ids(hf.get("eos_token_id")),
        full_head_dim=full_dim, full_kv_heads=int(full_kv) if full_kv else kv_heads, full_k_eq_v=k_eq_v,
        v_norm=True, final_softcap=softcap, ple_size=ple,
        ple_vocab=int(hf.get("vocab_size_per_layer_input") or hf["vocab_size"]) if ple else 0,
        kv_shared_layers=shared, double_wide_mlp=bool(hf.get("use_double_wide_mlp", False)), **moe)
    for name in ("full_head_dim", "full_kv_heads", "ple_size", "ple_vocab", "sliding_window"):
        if not 0 <= getattr(cfg, name) <= 1 << 24:
            raise SourceError(f"config: {name} = {getattr(cfg, name)} is out of range")
    if cfg.full_head_dim % 2 or heads % cfg.full_kv_heads:
        raise SourceError(f"config: full layers' head_dim {cfg.full_head_dim} must be even and their KV heads "
                          f"{cfg.full_kv_heads} divide the {heads} heads")
    return cfg


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.gemma4 import Gemma4Block

    return Gemma4Block(cfg, layer)


def graph_qkv(b, i: int, h: str):
    from specrt.convert.gemma4_graph import gemma4_qkv

    return (*gemma4_qkv(b, i, h), None)


def graph_layer_rest(b, i: int, x: str, attn: str, ple):
    from specrt.convert.gemma4_graph import gemma4_layer_rest

    return gemma4_layer_rest(b, i, x, attn, ple), None


def layer_shapes(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """A layer's tensors and their shapes (models/gemma4.py): q, k, v per the layer's head size and KV heads (no k
    or v where it reads another layer's cache, no v where its keys are its values), the MLP of its width, the
    per-layer input's projections, the router and fused experts of MoE layers."""
    p, h, d, kv = f"model.layers.{i}.", cfg.hidden_size, cfg.head_dim_of(i), cfg.kv_heads_of(i)
    width = cfg.intermediate_of(i)
    need = {p + "self_attn.q_proj.weight": (cfg.num_heads * d, h), p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
            p + "self_attn.q_norm.weight": (d,), p + "mlp.gate_proj.weight": (width, h),
            p + "mlp.up_proj.weight": (width, h), p + "mlp.down_proj.weight": (h, width)}
    if cfg.kv_source(i) == i:
        need.update({p + "self_attn.k_proj.weight": (kv * d, h), p + "self_attn.k_norm.weight": (d,)})
        if not cfg.k_eq_v(i):
            need[p + "self_attn.v_proj.weight"] = (kv * d, h)
    if cfg.ple_size:
        need.update({p + "per_layer_input_gate.weight": (cfg.ple_size, h),
                     p + "per_layer_projection.weight": (h, cfg.ple_size)})
        if i == 0:
            width_ple = cfg.num_layers * cfg.ple_size
            need.update({"model.embed_tokens_per_layer.weight": (cfg.ple_vocab, width_ple),
                         "model.per_layer_model_projection.weight": (width_ple, h),
                         "model.per_layer_projection_norm.weight": (cfg.ple_size,)})
    if cfg.moe_with_dense:
        e, w = cfg.num_experts, cfg.moe_intermediate_size
        need.update({p + "router.proj.weight": (e, h), p + "router.scale": (h,), p + "router.per_expert_scale": (e,),
                     **{f"{p}experts.{j}.gate_up_proj.weight": (2 * w, h) for j in range(e)},
                     **{f"{p}experts.{j}.down_proj.weight": (h, w) for j in range(e)}})
    return need


def hf_refs(refs: dict, hf: dict) -> dict:
    """The fused experts read as per-expert tensors."""
    from specrt.models.gemma4 import expert_view

    return expert_view(refs)


def gguf_config(reader, name: str) -> dict:
    from specrt.archs import gemma4_gguf
    from specrt.models.gguf_loader import field_value, tensor_data

    hf = gemma4_gguf.hf_config(reader, field_value, lambda tensor: tensor_data(reader, tensor))
    return gemma4_gguf.finish(hf, {t.name for t in reader.tensors})


def gguf_refs(path: Path, reader, hf: dict) -> dict:
    """The file's tensors under HF names (archs/gemma4_gguf.py); the stacked experts an expert at a time."""
    from specrt.archs import gemma4_gguf
    from specrt.models.gguf_loader import check_supported, decoder, expert_refs
    from specrt.models.tensor_source import TensorRef

    refs = {}
    for t in reader.tensors:
        base, _, suffix = t.name.rpartition(".")
        shape = tuple(int(x) for x in reversed(t.shape))
        if base.startswith("blk."):
            _, block, kind = base.split(".", 2)
            if kind in gemma4_gguf.FUSED_EXPERTS and suffix == "weight":  # the experts sit beside the MLP
                refs.update({name.replace(".mlp.experts.", ".experts.", 1): ref for name, ref in
                             expert_refs(path, t, gemma4_gguf.FUSED_EXPERTS[kind]).items()})
                continue
            name = gemma4_gguf.block_name(kind, suffix)
            name = f"model.layers.{block}.{name}" if name else None
        else:
            top = gemma4_gguf.TOP.get(base)
            name = f"{top}.{suffix}" if top else None
        if name is None:
            continue  # rope_freqs (read into the config) and tensors specrt does not use
        check_supported(t)
        refs[name] = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape, decoder(t.tensor_type),
                               gguf_type=t.tensor_type.name)
    return refs
