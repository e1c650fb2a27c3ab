"""Resolve a conversion SOURCE (catalog name, .gguf file or HF folder) and load its weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrt import archs, catalog
from specrt.bundle import sha256_file
from specrt.errors import SourceError
from specrt.models.config import ModelConfig, config_from_hf
from specrt.models.tensor_source import LazyWeights


@dataclass(frozen=True)
class ResolvedSource:
    kind: str  # "gguf" | "hf"
    path: Path
    name: str  # catalog name, or the file/folder name


@dataclass
class LoadedSource:
    source: ResolvedSource
    hf_config: dict
    config: ModelConfig
    weights: LazyWeights  # HF name -> float32 array, each read from the source file when asked for
    sha256: str  # of the GGUF file, or of config.json + the safetensors files


def resolve(source: str, log=print) -> ResolvedSource:
    path = Path(source).expanduser()
    if path.exists():
        if path.is_dir():
            return ResolvedSource("hf", path, path.name)
        if path.suffix.lower() == ".gguf":
            return ResolvedSource("gguf", path, path.stem)
        raise SourceError(f"{path}: not a .gguf file or an HF model folder")
    if source in catalog.CATALOG:
        return ResolvedSource("gguf", catalog.fetch(source, log=log), source)
    if "/" in source or source.endswith(".gguf"):
        raise SourceError(f"{source}: no such file or folder")
    raise SourceError(f"{source!r} is neither a path nor a catalog name (catalog: {', '.join(catalog.CATALOG)})")


def default_precision(source: str, device: str = "cpu") -> str:
    """What `specrt convert` makes of a source when no --precision is given: a GGUF whose weights are quantized in a
    format MatMulNBits holds exactly (every catalog model) keeps them (gguf); anything else converts at fp32 for the
    CPU, fp16 for a GPU (convert/gpu_profile.py)."""
    float_precision = "fp32" if device == "cpu" else "fp16"
    if source in catalog.CATALOG:
        return "gguf"
    path = Path(source).expanduser()
    if not (path.is_file() and path.suffix.lower() == ".gguf"):
        return float_precision
    from specrt.convert.gguf_exact import FORMS
    from specrt.models.gguf_loader import open_gguf

    reader = open_gguf(path)
    return "gguf" if any(len(t.shape) == 2 and t.tensor_type.name in FORMS for t in reader.tensors) else float_precision


def load(resolved: ResolvedSource) -> LoadedSource:
    if resolved.kind == "gguf":
        from specrt.models.gguf_loader import load_gguf

        hf, weights, _ = load_gguf(resolved.path)
        digest = sha256_file(resolved.path)
    else:
        from specrt.models.hf_loader import load_hf_folder, safetensors_files

        hf, weights = load_hf_folder(resolved.path)
        import hashlib

        h = hashlib.sha256((resolved.path / "config.json").read_bytes())
        for f in safetensors_files(resolved.path):
            h.update(sha256_file(f).encode())
        digest = h.hexdigest()
    config = config_from_hf(hf)
    _check_weights(config, weights, resolved)
    return LoadedSource(resolved, hf, config, weights, digest)


def linear_attention_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """The tensors of a Gated DeltaNet layer (prefix p = model.layers.{i}.linear_attn.) and their shapes."""
    h, c, hv = cfg.hidden_size, cfg.conv_channels, cfg.linear_value_heads
    value = hv * cfg.linear_value_dim
    return {p + "in_proj_qkv.weight": (c, h), p + "in_proj_z.weight": (value, h), p + "in_proj_b.weight": (hv, h),
            p + "in_proj_a.weight": (hv, h), p + "conv1d.weight": (c, 1, cfg.linear_conv_kernel),
            p + "A_log": (hv,), p + "dt_bias": (hv,), p + "norm.weight": (cfg.linear_value_dim,),
            p + "out_proj.weight": (h, value)}


def short_conv_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """The tensors of a short-convolution layer (prefix p = model.layers.{i}.conv.) and their shapes."""
    h = cfg.hidden_size
    return {p + "in_proj.weight": (3 * h, h), p + "conv.weight": (h, 1, cfg.linear_conv_kernel),
            p + "out_proj.weight": (h, h)}


def moe_shapes(cfg: ModelConfig, layer: int, weights, resolved: ResolvedSource) -> dict[str, tuple[int, ...]]:
    """The tensors of a mixture-of-experts layer and their shapes; experts beyond the config's count (the router and
    the experts disagreeing with num_experts) are named in one line."""
    p, h, width = f"model.layers.{layer}.mlp.", cfg.hidden_size, cfg.moe_intermediate_size
    if f"{p}experts.gate_up_proj" in weights:
        raise SourceError(f"{resolved.path}: layer {layer} stores its experts fused ({p}experts.gate_up_proj); "
                          "specrt reads the published per-expert layout (experts.N.gate_proj.weight ...)")
    extra = f"{p}experts.{cfg.num_experts}.gate_proj.weight"
    if extra in weights:
        raise SourceError(f"{resolved.path}: layer {layer} has tensor {extra}, but the config says num_experts = "
                          f"{cfg.num_experts}")
    need = {p + "gate.weight": (cfg.num_experts, h)}
    if cfg.moe_bias:  # gpt-oss
        need[p + "gate.bias"] = (cfg.num_experts,)
        for e in range(cfg.num_experts):
            q = f"{p}experts.{e}."
            need.update({q + "gate_proj.bias": (width,), q + "up_proj.bias": (width,), q + "down_proj.bias": (h,)})
    if cfg.shared_expert_size:
        q, width2 = p + "shared_expert.", cfg.shared_expert_size
        need.update({q + "gate_proj.weight": (width2, h), q + "up_proj.weight": (width2, h),
                     q + "down_proj.weight": (h, width2), p + "shared_expert_gate.weight": (1, h)})
    for e in range(cfg.num_experts):
        q = f"{p}experts.{e}."
        need.update({q + "gate_proj.weight": (width, h), q + "up_proj.weight": (width, h),
                     q + "down_proj.weight": (h, width)})
    return need


def _check_weights(cfg: ModelConfig, weights: LazyWeights, resolved: ResolvedSource) -> None:
    """Name the first missing or misshaped tensor instead of failing deep inside the builder."""
    need = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    arch = archs.of(cfg)
    own_shapes = arch.hook("layer_shapes")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        if own_shapes is not None:  # an architecture that lists its layers' tensors itself (Gemma 4)
            need.update(own_shapes(cfg, i))
            continue
        if cfg.is_moe(i):
            need.update(moe_shapes(cfg, i, weights, resolved))
        else:
            need[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, cfg.hidden_size)
            need[p + "mlp.down_proj.weight"] = (cfg.hidden_size, cfg.intermediate_size)
        if cfg.is_linear(i):
            need.update(linear_attention_shapes(cfg, p + "linear_attn."))
            continue
        if cfg.is_short_conv(i):
            need.update(short_conv_shapes(cfg, p + "conv."))
            continue
        gate = 2 if cfg.attn_output_gate else 1
        need[p + "self_attn.q_proj.weight"] = (gate * cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        need[p + "self_attn.k_proj.weight"] = (cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size)
        need[p + "self_attn.v_proj.weight"] = (cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size)
        need[p + "self_attn.o_proj.weight"] = (cfg.hidden_size, cfg.num_heads * cfg.head_dim)
        if cfg.attention_sinks:
            need[p + "self_attn.sinks"] = (cfg.num_heads,)
    check = arch.hook("check_weights")
    if check is not None:
        check(cfg, weights, resolved)
    if cfg.rotary_dim < cfg.head_dim and (cfg.rotary_dim // 2) % 8:
        raise SourceError(f"config: a partial rotary size of {cfg.rotary_dim} (head_dim x partial_rotary_factor) is "
                          "not a multiple of 16, which ONNX Runtime's GroupQueryAttention needs")
    if not cfg.tie_word_embeddings:
        need["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    for name, shape in need.items():
        if name not in weights:
            raise SourceError(f"{resolved.path}: missing tensor {name}")
        got = weights.shape(name)  # from the file's header: no tensor is read here
        if tuple(got) != shape:
            raise SourceError(f"{resolved.path}: tensor {name} has shape {tuple(got)}, expected {shape}")
