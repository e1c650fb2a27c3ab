"""llama.cpp's `gemma4` GGUF layout (Gemma 4 text: E2B/E4B, 31B, 26B-A4B), both ways: metadata -> HF config, GGUF
tensors -> HF names (reading), and HF tensors -> GGUF (writing, for tests and benchmarks).

As llama.cpp's converter writes it (conversion/gemma.py, Gemma4Model over Gemma3Model) and its loader reads it
(src/models/gemma4*.cpp):
- names: token_embd, output_norm (output absent: tied), rope_freqs (the full layers' proportional rope: 1.0 for each
  turned channel pair, 1e30 for the others), per_layer_token_embd, per_layer_model_proj, per_layer_proj_norm; per
  block attn_norm, attn_q, attn_q_norm, attn_k, attn_k_norm, attn_v (absent where the keys are the values),
  attn_output, post_attention_norm, ffn_norm (pre_feedforward_layernorm), ffn_{gate,up,down}, post_ffw_norm,
  layer_output_scale (layer_scalar), inp_gate / proj / post_norm (the per-layer input's gate, projection, norm);
  MoE blocks ffn_gate_inp (router.proj) with ffn_gate_inp.scale (router.scale), ffn_gate_up_exps (each expert's
  gate rows then up rows, [E, 2I, H]), ffn_down_exps with ffn_down_exps.scale (router.per_expert_scale),
  pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2. Norms are stored as they are (no 1 + w shift, unlike Gemma 3);
  q/k rows are not permuted (NEOX rope).
- metadata: gemma4.{block_count, context_length, embedding_length, feed_forward_length (an array per block with
  double-wide MLPs), attention.head_count, attention.head_count_kv (an array per block where full layers differ),
  attention.key_length / value_length (full layers' head size), attention.key_length_swa / value_length_swa,
  attention.layer_norm_rms_epsilon, attention.sliding_window, attention.sliding_window_pattern (a bool per block:
  sliding), attention.shared_kv_layers, embedding_length_per_layer_input, rope.freq_base (full), rope.freq_base_swa,
  rope.dimension_count (full head size), rope.dimension_count_swa, final_logit_softcapping, expert_count,
  expert_used_count, expert_feed_forward_length}.
"""

from __future__ import annotations

import numpy as np

from specrt.errors import SourceError
from specrt.models.gguf_metadata import arch_fields

ARCH = "gemma4"
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
       "per_layer_token_embd": "model.embed_tokens_per_layer",
       "per_layer_model_proj": "model.per_layer_model_projection",
       "per_layer_proj_norm": "model.per_layer_projection_norm"}
BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_q_norm": "self_attn.q_norm",
         "attn_k": "self_attn.k_proj", "attn_k_norm": "self_attn.k_norm", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "post_attention_norm": "post_attention_layernorm",
         "ffn_norm": "pre_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm",
         "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection", "post_norm": "post_per_layer_input_norm",
         "ffn_gate_inp": "router.proj", "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
         "post_ffw_norm_1": "post_feedforward_layernorm_1", "post_ffw_norm_2": "post_feedforward_layernorm_2"}
# block tensors whose HF name has no ".weight": (GGUF kind, suffix) -> HF name after the layer prefix
SCALES = {("layer_output_scale", "weight"): "layer_scalar", ("ffn_gate_inp", "scale"): "router.scale",
          ("ffn_down_exps", "scale"): "router.per_expert_scale"}
FUSED_EXPERTS = {"ffn_gate_up_exps": "gate_up_proj", "ffn_down_exps": "down_proj"}
ROPE_FREQS = "rope_freqs.weight"
NO_ROTATION = 1e30  # a rope_freqs factor that stops its channel pair turning


def hf_config(reader, field_value, tensor_data) -> dict:
    """The HF text config (model_type gemma4_text) a gemma4 GGUF's metadata describes; tensor_data(name) reads a
    small tensor (rope_freqs, whose count of turned pairs is the full layers' partial rotary factor)."""
    field, need = arch_fields(reader, field_value, ARCH)

    layers = int(need("block_count"))
    pattern = need("attention.sliding_window_pattern")
    pattern = list(pattern) if isinstance(pattern, (list, tuple, np.ndarray)) else None
    if pattern is None or len(pattern) != layers:
        raise SourceError(f"GGUF metadata {ARCH}.attention.sliding_window_pattern must give a flag per block "
                          f"({layers})")
    types = ["sliding_attention" if bool(s) else "full_attention" for s in pattern]
    heads = int(need("attention.head_count"))
    kv = need("attention.head_count_kv")
    kv = [int(k) for k in kv] if isinstance(kv, (list, tuple, np.ndarray)) else [int(kv)] * layers
    if len(kv) != layers:
        raise SourceError(f"GGUF metadata {ARCH}.attention.head_count_kv lists {len(kv)} blocks, not {layers}")
    ff = need("feed_forward_length")
    ff = [int(f) for f in ff] if isinstance(ff, (list, tuple, np.ndarray)) else [int(ff)] * layers
    shared = int(field("attention.shared_kv_layers", 0) or 0)
    sliding_kv = {k for k, t in zip(kv, types) if t == "sliding_attention"}
    full_kv = {k for k, t in zip(kv, types) if t == "full_attention"}
    if len(sliding_kv) > 1 or len(full_kv) > 1:
        raise SourceError(f"GGUF metadata {ARCH}.attention.head_count_kv differs between blocks of one kind: {kv}")
    base = ff[0]
    double = any(f == 2 * base for f in ff[layers - shared:]) if shared else False
    if any(f not in (base, 2 * base) for f in ff) or (not double and len(set(ff)) > 1):
        raise SourceError(f"GGUF metadata {ARCH}.feed_forward_length {ff} is neither one width nor a double-wide "
                          f"width for the shared-KV blocks")
    full_dim = int(need("attention.key_length"))
    partial = 1.0
    freqs = tensor_data(ROPE_FREQS)
    if freqs is not None:
        freqs = np.asarray(freqs, dtype=np.float64).reshape(-1)
        if len(freqs) != full_dim // 2:
            raise SourceError(f"tensor {ROPE_FREQS} has {len(freqs)} values, expected {full_dim // 2} "
                              f"(attention.key_length / 2)")
        partial = float(np.sum(freqs < 1e10)) * 2 / full_dim
    sliding_kv_heads = next(iter(sliding_kv)) if sliding_kv else kv[0]
    hf = {"model_type": "gemma4_text", "num_hidden_layers": layers, "hidden_size": int(need("embedding_length")),
          "intermediate_size": base, "use_double_wide_mlp": double, "num_attention_heads": heads,
          "num_key_value_heads": sliding_kv_heads, "head_dim": int(need("attention.key_length_swa")),
          "global_head_dim": full_dim, "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
          "sliding_window": int(need("attention.sliding_window")), "layer_types": types,
          "num_kv_shared_layers": shared, "hidden_size_per_layer_input": int(field("embedding_length_per_layer_input", 0) or 0),
          "final_logit_softcapping": float(field("final_logit_softcapping", 0.0) or 0.0),
          "max_position_embeddings": int(field("context_length", 131072)),
          "rope_parameters": {
              "sliding_attention": {"rope_type": "default", "rope_theta": float(field("rope.freq_base_swa", 10000.0))},
              "full_attention": {"rope_type": "proportional", "partial_rotary_factor": partial,
                                 "rope_theta": float(field("rope.freq_base", 1_000_000.0))}}}
    if full_kv and next(iter(full_kv)) != sliding_kv_heads:
        hf["num_global_key_value_heads"] = next(iter(full_kv))
    experts = int(field("expert_count", 0) or 0)
    if experts:
        hf.update(enable_moe_block=True, num_experts=experts, top_k_experts=int(need("expert_used_count")),
                  moe_intermediate_size=int(need("expert_feed_forward_length")))
    return hf


def block_name(kind: str, suffix: str) -> str | None:
    """The HF name (after model.layers.{i}.) of a block tensor, or None (a tensor specrt does not read)."""
    if (kind, suffix) in SCALES:
        return SCALES[(kind, suffix)]
    hf = BLOCK.get(kind)
    return f"{hf}.{suffix}" if hf and suffix in ("weight", "bias") else None


def finish(hf: dict, names: set[str]) -> dict:
    """Facts the tensors carry: keys that are the values where a full block has no attn_v."""
    full = [i for i, t in enumerate(hf["layer_types"]) if t == "full_attention"]
    first_shared = hf["num_hidden_layers"] - hf["num_kv_shared_layers"]
    own = [i for i in full if i < first_shared]
    hf["attention_k_eq_v"] = bool(own) and all(f"blk.{i}.attn_v.weight" not in names for i in own)
    if hf["attention_k_eq_v"] and "num_global_key_value_heads" not in hf:
        hf["num_global_key_value_heads"] = hf["num_key_value_heads"]
    return hf


# ---- writing (tests and benchmarks: an HF Gemma 4 as llama.cpp's converter writes it) ----
def gguf_name(hf_name: str) -> str | None:
    """The GGUF name of an HF tensor (None: not written, e.g. a shared layer's unread k/v, the per-expert tensors
    that stacked_experts writes)."""
    for gguf_top, hf_top in TOP.items():
        if hf_name == hf_top + ".weight":
            return gguf_top + ".weight"
    parts = hf_name.split(".")
    if len(parts) < 4 or parts[0] != "model" or parts[1] != "layers":
        return None
    i, rest = parts[2], ".".join(parts[3:])
    for (kind, suffix), hf in SCALES.items():
        if rest == hf:
            return f"blk.{i}.{kind}.{suffix}"
    for kind, hf in BLOCK.items():
        if rest == hf + ".weight":
            return f"blk.{i}.{kind}.weight"
    return None


def write_metadata(writer, hf: dict, cfg) -> None:
    """gemma4.* metadata for an HF text config (cfg: its specrt ModelConfig)."""
    layers = cfg.num_layers
    writer.add_block_count(layers)
    writer.add_context_length(min(cfg.max_position, 131072))
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length([cfg.intermediate_of(i) for i in range(layers)])
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv([cfg.kv_heads_of(i) for i in range(layers)])
    writer.add_key_length(cfg.full_head_dim)
    writer.add_value_length(cfg.full_head_dim)
    writer.add_key_length_swa(cfg.head_dim)
    writer.add_value_length_swa(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_sliding_window_pattern([cfg.is_sliding(i) for i in range(layers)])
    writer.add_shared_kv_layers(cfg.kv_shared_layers)
    writer.add_embedding_length_per_layer_input(cfg.ple_size)
    writer.add_rope_freq_base(cfg.rope.theta)
    writer.add_rope_freq_base_swa(cfg.local_rope.theta)
    writer.add_rope_dimension_count(cfg.full_head_dim)
    writer.add_rope_dimension_count_swa(cfg.head_dim)
    if cfg.final_softcap:
        writer.add_final_logit_softcapping(cfg.final_softcap)
    if cfg.num_experts:
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.experts_per_token)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)


def rope_freqs(cfg) -> np.ndarray:
    """The rope_freqs tensor: 1.0 for each of the full layers' turned pairs, NO_ROTATION for the rest."""
    turned = int(cfg.rope.partial * cfg.full_head_dim // 2)
    return np.array([1.0] * turned + [NO_ROTATION] * (cfg.full_head_dim // 2 - turned), dtype=np.float32)


def stacked_experts(weights, cfg, layer: int) -> dict[str, np.ndarray]:
    """A MoE layer's experts as llama.cpp stacks them: ffn_gate_up_exps [E, 2I, H] and ffn_down_exps [E, H, I]."""
    p = f"model.layers.{layer}.experts."
    return {f"blk.{layer}.{kind}.weight": np.stack([np.asarray(weights[f"{p}{e}.{hf}.weight"], np.float32)
                                                    for e in range(cfg.num_experts)])
            for kind, hf in FUSED_EXPERTS.items()}
