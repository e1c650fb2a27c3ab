"""Write tiny HF models as GGUF files the way llama.cpp's converter lays them out (for tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HF_TO_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


PERMUTED = ("llama", "smollm3")  # llama.cpp's converter permutes these architectures' q/k rows (LlamaModel's)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (half-split rotary -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str) -> str:
    base, _, suffix = hf_name.rpartition(".")
    if base == "model.embed_tokens":
        return f"token_embd.{suffix}"
    if base == "model.norm":
        return f"output_norm.{suffix}"
    if base == "lm_head":
        return f"output.{suffix}"
    _, _, idx, rest = base.split(".", 3)
    return f"blk.{idx}.{HF_TO_GGUF_BLOCK[rest]}.{suffix}"


def write_gguf(path: Path, arch: str, config, weights: dict[str, np.ndarray], encode, tokens: list[str] | None = None,
               bpe: bool = False) -> None:
    """encode(hf_name, gguf_ready_array) -> (data, raw_dtype or None) picks each tensor's storage; tokens: a
    tokenizer.ggml.tokens array to write too (bpe: as a gpt2-style tokenizer a conversion can build)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = getattr(config, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_bos_token_id(1)
    if bpe:
        _add_bpe_tokens(writer, gguf, tokens, 2, "default")
    else:
        writer.add_eos_token_id(2)
        if tokens is not None:
            writer.add_token_list(tokens)
    for name, w in weights.items():
        w = np.ascontiguousarray(w, dtype=np.float32)
        if arch in PERMUTED and name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, config.num_attention_heads)
        elif arch in PERMUTED and name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, config.num_key_value_heads)
        data, raw_dtype = encode(name, w)
        if raw_dtype is None:
            writer.add_tensor(gguf_name(name), data)
        else:
            writer.add_tensor(gguf_name(name), data, raw_dtype=raw_dtype)
    _write_and_close(writer)


def write_qwen35_gguf(path: Path, hf: dict, weights: dict[str, np.ndarray], tokens: list[str], eos: int,
                      mtp_layers: int = 0, encode=None, names_from: dict | None = None,
                      fused_experts: bool = False) -> None:
    """A Qwen3.5 model (HF names, mtp.* included) as llama.cpp's converter writes it (archs/qwen3_5_gguf.py: its
    names, value transforms and qwen35 metadata; a Qwen3.5-MoE config: qwen35moe, experts stacked); F32 tensors unless encode(gguf_name, array) -> (data, raw_dtype)
    picks another storage; a gpt2-style token list (its last two tokens become "Ġ" and "ĠĠ", for the one merge
    a BPE tokenizer needs). names_from: the config the tensors are laid out by, where `hf` (the metadata) is made
    to disagree with them."""
    import gguf

    from specrt.archs import qwen3_5_gguf as gguf_qwen35

    moe = bool(hf.get("num_experts"))  # Qwen3.5-MoE: qwen35moe, its experts stacked per projection
    writer = gguf.GGUFWriter(str(path), gguf_qwen35.MOE_ARCH if moe else gguf_qwen35.ARCH)
    gguf_qwen35.write_metadata(writer, hf, mtp_layers)
    _add_bpe_tokens(writer, gguf, tokens, eos, "qwen35")
    tensors = [gguf_qwen35.gguf_tensor(name, w, names_from or hf) for name, w in weights.items()
               if ".mlp.experts." not in name]
    tensors += list(gguf_qwen35.stacked_experts(weights, names_from or hf, fused_experts).items())
    for gname, data in tensors:
        stored, raw_dtype = encode(gname, data) if encode else (data, None)
        writer.add_tensor(gname, stored, raw_dtype=raw_dtype)
    _write_and_close(writer)


def write_qwen3moe_gguf(path: Path, hf: dict, weights: dict[str, np.ndarray], tokens: list[str], eos: int,
                        encode=None) -> None:
    """A Qwen3-MoE model (HF per-expert names) as llama.cpp's converter writes it: arch qwen3moe, its expert counts
    in the metadata, the router as ffn_gate_inp and each projection's experts stacked into one [E, rows, cols]
    tensor (ffn_{gate,up,down}_exps); F32 unless encode(gguf_name, array) -> (data, raw_dtype) picks another."""
    import re

    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    _add_shape_metadata(writer, hf)
    writer.add_rope_freq_base(float((hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 1e6))))
    writer.add_expert_count(hf.get("num_experts") or hf["num_local_experts"])
    writer.add_expert_used_count(hf["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(hf["moe_intermediate_size"])
    _add_bpe_tokens(writer, gguf, tokens, eos, "qwen2")
    stacked: dict[str, list] = {}
    out: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", name)
        if m:
            stacked.setdefault(f"blk.{m.group(1)}.ffn_{m.group(3)}_exps.weight", []).append((int(m.group(2)), w))
        elif re.match(r"model\.layers\.\d+\.mlp\.gate\.weight$", name):
            out[f"blk.{name.split('.')[2]}.ffn_gate_inp.weight"] = w
        else:
            out[gguf_name(name)] = w
    for gname, parts in stacked.items():
        out[gname] = np.stack([w for _, w in sorted(parts, key=lambda p: p[0])])
    for gname, w in out.items():
        data, raw_dtype = encode(gname, np.ascontiguousarray(w, dtype=np.float32)) if encode else (
            np.ascontiguousarray(w, dtype=np.float32), None)
        writer.add_tensor(gname, data, raw_dtype=raw_dtype)
    _write_and_close(writer)


def write_gpt_oss_gguf(path: Path, hf: dict, weights: dict[str, np.ndarray], tokens: list[str], eos: int,
                       experts_as=None) -> None:
    """A gpt-oss model (transformers' bf16 layout: fused gate_up_proj [E, H, 2I], gate and up interleaved) as
    llama.cpp's converter writes it (docs/research-gguf-moe-layouts.md): arch gpt-oss, gate and up split into
    ffn_gate_exps / ffn_up_exps [E, I, H] with biases [E, I], ffn_down_exps [E, H, I], the router as ffn_gate_inp
    (+ bias), sinks as attn_sinks.weight, the pre-MoE norm as post_attention_norm, yarn in rope.scaling.*; F32 unless
    experts_as (a GGML type) stores the expert matrices."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    _add_shape_metadata(writer, hf)
    rope = hf.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    writer.add_sliding_window(hf["sliding_window"])
    writer.add_expert_count(hf["num_local_experts"])
    writer.add_expert_used_count(hf["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(hf["intermediate_size"])
    _add_bpe_tokens(writer, gguf, tokens, eos, "default")
    out: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        w = np.asarray(w, dtype=np.float32)
        parts = name.split(".")
        if name.startswith("model.layers.") and ".mlp." in name:
            blk = f"blk.{parts[2]}."
            rest = ".".join(parts[4:])
            if rest == "router.weight":
                out[blk + "ffn_gate_inp.weight"] = w
            elif rest == "router.bias":
                out[blk + "ffn_gate_inp.bias"] = w
            elif rest == "experts.gate_up_proj":  # [E, H, 2I] -> gate and up [E, I, H]
                out[blk + "ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :, 0::2].transpose(0, 2, 1))
                out[blk + "ffn_up_exps.weight"] = np.ascontiguousarray(w[:, :, 1::2].transpose(0, 2, 1))
            elif rest == "experts.gate_up_proj_bias":
                out[blk + "ffn_gate_exps.bias"] = np.ascontiguousarray(w[:, 0::2])
                out[blk + "ffn_up_exps.bias"] = np.ascontiguousarray(w[:, 1::2])
            elif rest == "experts.down_proj":  # [E, I, H] -> [E, H, I]
                out[blk + "ffn_down_exps.weight"] = np.ascontiguousarray(w.transpose(0, 2, 1))
            elif rest == "experts.down_proj_bias":
                out[blk + "ffn_down_exps.bias"] = w
            else:
                raise KeyError(name)
        elif name.endswith("self_attn.sinks"):
            out[f"blk.{parts[2]}.attn_sinks.weight"] = w
        elif name.endswith("post_attention_layernorm.weight"):
            out[f"blk.{parts[2]}.post_attention_norm.weight"] = w
        else:
            out[gguf_name(name)] = w
    for gname, w in out.items():
        if experts_as is not None and gname.endswith("_exps.weight"):
            writer.add_tensor(gname, gguf.quants.quantize(w, experts_as), raw_dtype=experts_as)
        else:
            writer.add_tensor(gname, w)
    _write_and_close(writer)


def write_gemma4_gguf(path: Path, hf: dict, weights: dict[str, np.ndarray], tokens: list[str], eos: int,
                      encode=None) -> None:
    """A Gemma 4 text model (HF names, experts per expert) as llama.cpp's converter writes it
    (archs/gemma4_gguf.py): gemma4 metadata, rope_freqs, the MoE experts stacked, shared layers' unread k/v left
    out; F32 unless encode(gguf_name, array) -> (data, raw_dtype) picks another storage."""
    import gguf

    from specrt.archs import gemma4_gguf as gguf_gemma4
    from specrt.models.config import config_from_hf

    cfg = config_from_hf(hf)
    writer = gguf.GGUFWriter(str(path), gguf_gemma4.ARCH)
    gguf_gemma4.write_metadata(writer, hf, cfg)
    _add_bpe_tokens(writer, gguf, tokens, eos, "default")
    tensors = [(gguf_gemma4.gguf_name(name), np.asarray(w, np.float32)) for name, w in weights.items()
               if ".experts." not in name and name != "lm_head.weight"]
    tensors = [(g, w.reshape(1) if g.endswith("layer_output_scale.weight") else w) for g, w in tensors if g]
    for i in cfg.moe_layers:
        tensors += list(gguf_gemma4.stacked_experts(weights, cfg, i).items())
    tensors.append((gguf_gemma4.ROPE_FREQS, gguf_gemma4.rope_freqs(cfg)))
    for gname, data in tensors:
        stored, raw_dtype = encode(gname, data) if encode else (data, None)
        writer.add_tensor(gname, stored, raw_dtype=raw_dtype)
    _write_and_close(writer)


def _add_shape_metadata(writer, hf: dict) -> None:
    """The block, width, head and norm metadata every llama-family writer starts with (HF config keys)."""
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_head_count_kv(hf["num_key_value_heads"])
    writer.add_key_length(hf["head_dim"])
    writer.add_value_length(hf["head_dim"])
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])


def _add_bpe_tokens(writer, gguf, tokens: list[str], eos: int, pre: str) -> None:
    """A gpt2-style token list whose last two tokens become "Ġ" and "ĠĠ", for the one merge a BPE tokenizer needs."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    tokens = list(tokens[:-2]) + ["\u0120", "\u0120\u0120"]
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    writer.add_token_merges(["\u0120 \u0120"])
    writer.add_eos_token_id(eos)


def _write_and_close(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


PHI3_BLOCK = {"input_layernorm": "attn_norm", "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_phi3_gguf(path: Path, hf: dict, weights: dict[str, np.ndarray], tokens: list[str], eos: int) -> None:
    """A Phi-3 model as llama.cpp's converter writes it (conversion/phi.py, Phi3MiniModel): the fused qkv_proj and
    gate_up_proj kept as attn_qkv and ffn_up, the rotary size as rope.dimension_count, LongRoPE's factors as the
    rope_factors_short / rope_factors_long tensors with rope.scaling.attn_factor (sqrt(1 + ln s / ln original),
    s = max positions / original) and original_context_length; F32."""
    import math

    import gguf

    writer = gguf.GGUFWriter(str(path), "phi3")
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    rope = hf.get("rope_parameters") or {}
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(hf["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * hidden) // heads)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    original = hf["original_max_position_embeddings"]
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_sliding_window(hf.get("sliding_window") or 0)
    if rope.get("long_factor"):
        scale = hf["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original)))
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    _add_bpe_tokens(writer, gguf, tokens, eos, "default")
    for name, w in weights.items():
        base, _, suffix = name.rpartition(".")
        if base.startswith("model.layers."):
            _, _, idx, rest = base.split(".", 3)
            gname = f"blk.{idx}.{PHI3_BLOCK[rest]}.{suffix}"
        else:
            gname = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}[base] + \
                f".{suffix}"
        writer.add_tensor(gname, np.ascontiguousarray(w, dtype=np.float32))
    _write_and_close(writer)


LFM2_BLOCK = {"operator_norm": "attn_norm", "ffn_norm": "ffn_norm", "feed_forward.w1": "ffn_gate",
              "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_output",
              "self_attn.q_layernorm": "attn_q_norm", "self_attn.k_layernorm": "attn_k_norm",
              "conv.in_proj": "shortconv.in_proj", "conv.conv": "shortconv.conv", "conv.out_proj": "shortconv.out_proj"}


def write_lfm2_gguf(path: Path, hf: dict, weights: dict[str, np.ndarray], tokens: list[str], eos: int) -> None:
    """An LFM2 model as llama.cpp's converter writes it (conversion/lfm2.py, LFM2Model): head_count_kv per layer (0
    for a conv layer), shortconv.l_cache, the adjusted MLP width (the w1 rows), the conv weight squeezed to [H, K],
    embedding_norm as token_embd_norm; F32."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "lfm2")
    layers = hf["num_hidden_layers"]
    writer.add_block_count(layers)
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(int(weights["model.layers.0.feed_forward.w1.weight"].shape[0]))
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_head_count_kv([0 if t == "conv" else hf["num_key_value_heads"] for t in hf["layer_types"]])
    writer.add_layer_norm_rms_eps(hf["norm_eps"])
    writer.add_rope_freq_base(float((hf.get("rope_parameters") or {}).get("rope_theta", 1e6)))
    writer.add_uint32("lfm2.shortconv.l_cache", hf["conv_L_cache"])
    _add_bpe_tokens(writer, gguf, tokens, eos, "default")
    for name, w in weights.items():
        base, _, suffix = name.rpartition(".")
        if base.startswith("model.layers."):
            _, _, idx, rest = base.split(".", 3)
            gname = f"blk.{idx}.{LFM2_BLOCK[rest]}.{suffix}"
            if rest == "conv.conv":
                w = w.reshape(w.shape[0], w.shape[-1])
        else:
            gname = {"model.embed_tokens": "token_embd", "model.embedding_norm": "token_embd_norm",
                     "lm_head": "output"}[base] + f".{suffix}"
        writer.add_tensor(gname, np.ascontiguousarray(w, dtype=np.float32))
    _write_and_close(writer)


def write_tiny_gguf(tiny: str, path: Path):
    """The tiny transformers model `tiny` (tests/tiny_models.py) as llama.cpp's converter writes its architecture,
    F32; returns the transformers model. KeyError for a tiny model without a GGUF writer here."""
    from safetensors.numpy import load_file

    from tests.tiny_models import WORDS, hf_model

    model = hf_model(tiny)
    hf = model.config.to_dict()
    tokens = ["<|endoftext|>"] + list(WORDS[1:97])
    folder = Path(path).with_suffix(".hf")
    model.save_pretrained(folder)
    weights = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if tiny in ("llama", "qwen2", "qwen3", "smollm3"):
        write_gguf(path, tiny, model.config, weights, lambda name, w: (w, None), tokens, bpe=True)
    elif tiny in ("phi3", "phi3_long"):
        write_phi3_gguf(path, hf, weights, tokens, eos=2)
    elif tiny == "qwen3_moe":
        write_qwen3moe_gguf(path, hf, weights, tokens, eos=4)
    elif tiny == "gpt_oss":
        write_gpt_oss_gguf(path, hf, weights, tokens, eos=4)
    elif tiny in ("gemma4_text", "gemma4_moe"):
        from specrt.models.gemma4 import expert_view

        write_gemma4_gguf(path, hf, expert_view(weights), tokens, eos=4)
    elif tiny == "qwen3_5_text":
        write_qwen35_gguf(path, hf, weights, tokens, eos=4)
    elif tiny == "lfm2":
        write_lfm2_gguf(path, hf, weights, tokens, eos=2)
    else:
        raise KeyError(tiny)
    return model
