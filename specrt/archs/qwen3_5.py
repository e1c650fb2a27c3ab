"""Qwen3.5 / 3.6 hybrids, dense and MoE (text part): three Gated DeltaNet layers (a recurrent and a conv state,
models/gated_deltanet.py) to one gated full-attention layer, (1 + w) norms, partial rotary; the MoE variant's MLPs
are experts beside a shared expert. The checkpoint's MTP module drafts for it, read from HF folders and from GGUF
files (where it is the block after the layers). llama.cpp's layout: archs/qwen3_5_gguf.py."""

from __future__ import annotations

from pathlib import Path

from specrt.errors import SourceError
from specrt.models.config import (FULL_ATTENTION, LIMITS, LINEAR_ATTENTION, ModelConfig, eos_ids, moe_fields,
                                  rope_from_hf, sizes, text_config)


def config_from_hf(hf: dict) -> ModelConfig:
    """Qwen3.5 / 3.6 dense (text part): 3 Gated DeltaNet layers per gated full-attention layer, (1 + w) norms,
    partial rotary (multimodal rope sections, which are equal for text); the MoE variant's every MLP a mixture of
    experts beside a shared expert. The published multimodal layout's language model is its text_config."""
    if hf["model_type"] in ("qwen3_5", "qwen3_5_moe"):
        hf = text_config(hf, hf["model_type"] + "_text", tie_default=False)
    hidden, heads, layers, head_dim = sizes(hf)
    model_type = hf["model_type"]
    params = hf.get("rope_parameters") or {}
    rope = rope_from_hf(hf, params if "rope_theta" in params else None)
    interval = int(hf.get("full_attention_interval", 4))
    layer_types = hf.get("layer_types") or [
        LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(layers)]
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise SourceError(f"config: layer_types must list {layers} layers (num_hidden_layers)")
    bad = [t for t in layer_types if t not in (LINEAR_ATTENTION, FULL_ATTENTION)]
    if bad:
        raise SourceError(f"config: layer_types has {bad[0]!r} (expected linear_attention or full_attention)")
    act = hf.get("hidden_act") or "silu"
    if act != "silu":
        raise SourceError(f"unsupported activation {act!r} for qwen3_5 (supported: silu)")
    partial = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    if not 0 < partial <= 1:
        raise SourceError(f"config: partial_rotary_factor = {partial} must be in (0, 1]")
    moe = {}
    if model_type == "qwen3_5_moe_text":  # every layer sparse, the top-k always divided by their sum
        moe = dict(moe_fields({**hf, "norm_topk_prob": True, "mlp_only_layers": [], "decoder_sparse_step": 1},
                               layers), shared_expert_size=int(hf.get("shared_expert_intermediate_size") or 0))
        if not moe:
            raise SourceError("config: a qwen3_5_moe config needs num_experts")
        if not 0 <= moe["shared_expert_size"] <= LIMITS["intermediate_size"]:
            raise SourceError(f"config: shared_expert_intermediate_size = {moe['shared_expert_size']} is out of range")
    width = hf.get("intermediate_size") or moe.get("shared_expert_size") or moe.get("moe_intermediate_size")
    cfg = ModelConfig(
        model_type=model_type, family="qwen3_5", vocab_size=int(hf["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(width), num_layers=layers, num_heads=heads,
        num_kv_heads=heads if hf.get("num_key_value_heads") is None else int(hf["num_key_value_heads"]),
        head_dim=head_dim, rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position=int(hf.get("max_position_embeddings", 32768)), rope=rope,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=bool(hf.get("attention_bias", False)), qk_norm=True, norm_offset=1.0, hidden_act="silu",
        bos_token_id=hf.get("bos_token_id"), eos_token_ids=eos_ids(hf.get("eos_token_id")),
        layer_types=tuple(layer_types), attn_output_gate=True, partial_rotary=partial,
        linear_key_heads=int(hf.get("linear_num_key_heads", 16)), linear_value_heads=int(hf.get("linear_num_value_heads", 32)),
        linear_key_dim=int(hf.get("linear_key_head_dim", 128)), linear_value_dim=int(hf.get("linear_value_head_dim", 128)),
        linear_conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)), **moe)
    for name in ("linear_key_heads", "linear_value_heads", "linear_key_dim", "linear_value_dim", "linear_conv_kernel"):
        if not 1 <= getattr(cfg, name) <= 1 << 16:
            raise SourceError(f"config: {name} = {getattr(cfg, name)} is out of range (1..65536)")
    if cfg.linear_value_heads % cfg.linear_key_heads:
        raise SourceError(f"config: linear_num_value_heads {cfg.linear_value_heads} is not a multiple of "
                          f"linear_num_key_heads {cfg.linear_key_heads}")
    if cfg.rotary_dim % 2 or cfg.rotary_dim < 2:
        raise SourceError(f"config: head_dim {head_dim} x partial_rotary_factor {partial} gives an odd rotary size")
    return cfg


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.gated_deltanet import HybridBlock  # Gated DeltaNet or gated attention per layer

    return HybridBlock(cfg, layer)


def check_weights(cfg: ModelConfig, weights, where) -> None:
    """A layer whose tensors are of the other kind than config's layer_types says: named in one line."""
    for i in range(cfg.num_layers):
        other = "self_attn.q_proj.weight" if cfg.is_linear(i) else "linear_attn.in_proj_qkv.weight"
        if f"model.layers.{i}.{other}" in weights:
            said = cfg.layer_types[i] if cfg.layer_types else "full_attention"
            source = "config.json's layer_types" if where.kind == "hf" else "its qwen35.attention.recurrent_layers"
            raise SourceError(f"{where.path}: layer {i} has tensor model.layers.{i}.{other}, but {source} says {said}")


def gguf_config(reader, name: str) -> dict:
    from specrt.archs import qwen3_5_gguf
    from specrt.models.gguf_loader import field_value

    return qwen3_5_gguf.hf_config(reader, field_value, name)


def gguf_refs(path: Path, reader, hf: dict) -> dict:
    """The file's tensors under HF names (archs/qwen3_5_gguf.py: renamed, value heads regrouped, norms shifted
    back); the MTP module's block as model.mtp.*; the stacked experts an expert at a time. Their shapes are checked
    against the config by the converter."""
    from specrt.archs import qwen3_5_gguf
    from specrt.models import gguf_loader as loader
    from specrt.models.tensor_source import TensorRef

    refs = {}
    for t in reader.tensors:
        kind = t.name.split(".")[2] if t.name.startswith("blk.") and t.name.count(".") >= 3 else ""
        if kind in qwen3_5_gguf.EXPERTS or kind == qwen3_5_gguf.FUSED_EXPERTS:
            refs.update(_expert_refs(path, t, hf))
            continue
        found = qwen3_5_gguf.hf_tensor(t.name, hf)
        if found is None:
            continue
        name, after = found
        loader.check_supported(t)
        shape = tuple(int(x) for x in reversed(t.shape))
        if name.endswith("conv1d.weight") and len(shape) == 2:
            shape = (shape[0], 1, shape[1])  # stored squeezed [C, K]; HF's depthwise conv weight is [C, 1, K]
        if name.endswith("shared_expert_gate.weight") and len(shape) == 1:
            shape = (1, shape[0])  # one row, stored as a vector
        reorder = after if kind in qwen3_5_gguf.REORDERING else None
        refs[name] = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape,
                               loader.decoder(t.tensor_type, after), rows_apart=after is None,
                               gguf_type=t.tensor_type.name, reorder=reorder)
    return refs


def _expert_refs(path: Path, t, hf: dict) -> dict:
    """A qwen35moe block's stacked experts (ffn_{gate,up,down}_exps [E, rows, cols], or ffn_gate_up_exps [E, 2 x
    rows, cols]: each expert's gate rows, then its up rows) as per-expert HF tensors; the block after the layers
    is the MTP module's."""
    from specrt.archs import qwen3_5_gguf
    from specrt.models import gguf_loader as loader
    from specrt.models.tensor_source import TensorRef

    block = int(t.name.split(".")[1])
    if block > hf["num_hidden_layers"]:
        return {}  # a second MTP module: only the first is read
    prefix = "model.mtp.layers.0" if block == hf["num_hidden_layers"] else f"model.layers.{block}"
    kind = t.name.split(".")[2]
    if kind != qwen3_5_gguf.FUSED_EXPERTS:
        return {name.replace(f"model.layers.{block}", prefix, 1): ref
                for name, ref in loader.expert_refs(path, t, qwen3_5_gguf.EXPERTS[kind]).items()}
    loader.check_supported(t)
    experts, rows, cols = tuple(int(x) for x in reversed(t.shape)) if len(t.shape) == 3 else (0, 0, 0)
    if not experts or rows % 2 or int(t.n_bytes) % (2 * experts):
        raise SourceError(f"tensor {t.name} has shape {list(reversed([int(x) for x in t.shape]))}, expected "
                          f"[experts, 2 x expert rows, columns]")
    # as 2E stacked halves: half 2e is expert e's gate rows, half 2e + 1 its up rows
    halves = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), (2 * experts, rows // 2, cols),
                       loader.decoder(t.tensor_type), gguf_type=t.tensor_type.name)
    out = {}
    for e in range(experts):
        out[f"{prefix}.mlp.experts.{e}.gate_proj.weight"] = halves.expert(2 * e, (rows // 2, cols))
        out[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = halves.expert(2 * e + 1, (rows // 2, cols))
    return out
