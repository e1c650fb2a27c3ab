"""llama.cpp's `qwen35` and `qwen35moe` GGUF layouts (Qwen3.5 / 3.6 dense and MoE), both ways: metadata -> HF config,
GGUF tensors -> HF names and values (reading), and HF tensors -> GGUF (writing, for tests and benchmarks).

As llama.cpp's converter writes it (conversion/qwen.py, Qwen3_5TextModel; read from the llama.cpp that
llama-cpp-python 0.3.36 vendors, 0c1e57098):
- names: token_embd, output_norm, output; per block attn_norm, post_attention_norm, ffn_{gate,up,down}; linear
  layers attn_qkv (in_proj_qkv), attn_gate (in_proj_z), ssm_beta (in_proj_b), ssm_alpha (in_proj_a), ssm_conv1d
  [C, K], ssm_a (no .weight suffix), ssm_dt.bias (dt_bias), ssm_norm, ssm_out (out_proj); attention layers
  attn_q (query and gate interleaved per head, as HF's q_proj), attn_k, attn_v, attn_output, attn_q_norm,
  attn_k_norm. The MTP module is block L = the model's layer count (block_count counts it, nextn_predict_layers
  says so): nextn.eh_proj (mtp.fc), nextn.enorm / nextn.hnorm (pre_fc_norm_embedding / _hidden),
  nextn.shared_head_norm (mtp.norm), and the module's decoder block under the ordinary block names.
- values: ssm_a = -exp(A_log); every norm except ssm_norm is stored as 1 + w; and where value heads outnumber key
  heads, value heads are stored tiled (head r * n_k + g) instead of grouped by key head (g * r_per_k + r), in
  attn_qkv's value rows, attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt, ssm_conv1d's value channels and
  ssm_out's columns.
- metadata: qwen35.{block_count, embedding_length, feed_forward_length, attention.head_count(_kv),
  attention.key_length, attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count (rotary size),
  ssm.conv_kernel, ssm.state_size (key head size), ssm.group_count (key heads), ssm.time_step_rank (value heads),
  ssm.inner_size (value heads x value head size), attention.recurrent_layers (per block), full_attention_interval,
  nextn_predict_layers}.
- qwen35moe (Qwen3_5MoeTextModel, the same converter with Qwen2MoeModel's expert handling): every block's MLP is
  ffn_gate_inp (the router, mlp.gate), ffn_{gate,up,down}_exps (the experts stacked [E, rows, cols]; a fused
  ffn_gate_up_exps holds each expert's gate rows then its up rows), ffn_{gate,up,down}_shexp (the shared expert)
  and ffn_gate_inp_shexp (its sigmoid gate, one row stored as a vector); the MTP block the same; metadata
  expert_count, expert_used_count, expert_feed_forward_length, expert_shared_feed_forward_length.
"""

from __future__ import annotations

import functools

import numpy as np

from specrt.errors import SourceError
from specrt.models.gguf_metadata import arch_fields

ARCH, MOE_ARCH = "qwen35", "qwen35moe"
ARCHS = (ARCH, MOE_ARCH)
LINEAR = {"attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
          "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a",
          "ssm_conv1d": "linear_attn.conv1d", "ssm_a": "linear_attn.A_log", "ssm_dt": "linear_attn.dt_bias",
          "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj"}
SHARED = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          # qwen35moe: the router, the shared expert and its gate (the experts are stacked: EXPERTS)
          "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
          "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
          "ffn_down_shexp": "mlp.shared_expert.down_proj"}
EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
FUSED_EXPERTS = "ffn_gate_up_exps"  # each expert's gate rows, then its up rows
NEXTN = {"nextn.eh_proj": "fc", "nextn.enorm": "pre_fc_norm_embedding", "nextn.hnorm": "pre_fc_norm_hidden",
         "nextn.shared_head_norm": "norm"}
PLUS_ONE = ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm", "nextn.enorm", "nextn.hnorm",
            "nextn.shared_head_norm")


def hf_config(reader, field_value, arch: str = ARCH) -> dict:
    """The HF text config (model_type qwen3_5_text, or qwen3_5_moe_text for qwen35moe) a GGUF's metadata describes;
    SourceError naming the field where it is missing or inconsistent."""
    _field, need = arch_fields(reader, field_value, arch)

    blocks, nextn = int(need("block_count")), int(_field("nextn_predict_layers", 0) or 0)
    layers = blocks - nextn
    heads, head_dim = int(need("attention.head_count")), int(need("attention.key_length"))
    value_heads, key_heads = int(need("ssm.time_step_rank")), int(need("ssm.group_count"))
    inner = int(need("ssm.inner_size"))
    if value_heads < 1 or inner % value_heads:
        raise SourceError(f"GGUF metadata {arch}.ssm.inner_size = {inner} is not a multiple of ssm.time_step_rank "
                          f"= {value_heads} (value heads)")
    if layers < 1:
        raise SourceError(f"GGUF metadata {arch}.block_count = {blocks} leaves no layers beside "
                          f"nextn_predict_layers = {nextn}")
    rotary = int(_field("rope.dimension_count", head_dim // 4))
    recurrent = _field("attention.recurrent_layers")
    interval = int(_field("full_attention_interval", 4))
    if recurrent is not None:
        if len(recurrent) < layers:
            raise SourceError(f"GGUF metadata {arch}.attention.recurrent_layers lists {len(recurrent)} blocks, "
                              f"block_count says {blocks}")
        types = ["linear_attention" if bool(r) else "full_attention" for r in recurrent[:layers]]
    else:
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    moe = {}
    if arch == MOE_ARCH:
        experts = int(need("expert_count"))
        moe = {"num_experts": experts, "num_experts_per_tok": int(need("expert_used_count")),
               "moe_intermediate_size": int(need("expert_feed_forward_length")),
               "shared_expert_intermediate_size": int(_field("expert_shared_feed_forward_length", 0) or 0)}
        if not moe["shared_expert_intermediate_size"]:  # the key is optional: the shared expert's own rows say
            shexp = next((t for t in reader.tensors if t.name == "blk.0.ffn_up_shexp.weight"), None)
            if shexp is not None:
                moe["shared_expert_intermediate_size"] = int(shexp.shape[-1])
    width = _field("feed_forward_length")
    if width is None and not moe:
        need("feed_forward_length")
    hf = {"model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text", "num_hidden_layers": layers,
          "hidden_size": int(need("embedding_length")),
          "intermediate_size": int(width) if width is not None else None, "num_attention_heads": heads,
          "num_key_value_heads": int(_field("attention.head_count_kv", heads)),
          "head_dim": head_dim, "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
          "max_position_embeddings": int(_field("context_length", 32768)),
          "rope_parameters": {"rope_type": "default", "rope_theta": float(need("rope.freq_base")),
                              "partial_rotary_factor": rotary / head_dim},
          "linear_conv_kernel_dim": int(need("ssm.conv_kernel")), "linear_key_head_dim": int(need("ssm.state_size")),
          "linear_value_head_dim": inner // value_heads, "linear_num_key_heads": key_heads,
          "linear_num_value_heads": value_heads, "layer_types": types, "mtp_num_hidden_layers": nextn, **moe}
    return {k: v for k, v in hf.items() if v is not None}


def _tiled_to_grouped(w: np.ndarray, key_heads: int, value_heads: int, axis: int = 0) -> np.ndarray:
    """Value heads (blocks along `axis`) from llama.cpp's tiled order back to HF's grouped one."""
    if value_heads == key_heads:
        return w
    w = np.moveaxis(w, axis, 0)
    per = value_heads // key_heads
    out = w.reshape(per, key_heads, -1, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)
    return np.moveaxis(out, 0, axis)


def _grouped_to_tiled(w: np.ndarray, key_heads: int, value_heads: int, axis: int = 0) -> np.ndarray:
    if value_heads == key_heads:
        return w
    w = np.moveaxis(w, axis, 0)
    per = value_heads // key_heads
    out = w.reshape(key_heads, per, -1, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)
    return np.moveaxis(out, 0, axis)


def _value_part(fn, w: np.ndarray, start: int, key_heads: int, value_heads: int, axis: int = 0) -> np.ndarray:
    """fn applied to the value rows (from `start` on along axis) only: attn_qkv's and ssm_conv1d's q/k stay."""
    w = np.array(w, copy=True)
    index = [slice(None)] * w.ndim
    index[axis] = slice(start, None)
    w[tuple(index)] = fn(w[tuple(index)], key_heads, value_heads, axis)
    return w


# the kinds whose transform only reorders rows, or whole heads of columns (--precision gguf carries their blocks)
REORDERING = ("attn_gate", "ssm_beta", "ssm_alpha", "attn_qkv", "ssm_out")


def _reader_transform(kind: str, hf: dict):
    """The undoing of llama.cpp's converter for one GGUF tensor kind (None: stored as HF has it)."""
    nk, nv = hf["linear_num_key_heads"], hf["linear_num_value_heads"]
    qk = 2 * nk * hf["linear_key_head_dim"]
    untile = functools.partial(_tiled_to_grouped, key_heads=nk, value_heads=nv)
    if kind in PLUS_ONE:
        return lambda w: w - 1.0
    if kind in ("attn_gate", "ssm_beta", "ssm_alpha", "ssm_dt"):
        return untile
    if kind == "ssm_a":
        return lambda w: np.log(-untile(w)).astype(np.float32)
    if kind == "attn_qkv":
        return lambda w: _value_part(_tiled_to_grouped, w, qk, nk, nv)
    if kind == "ssm_conv1d":  # read as [C, 1, K] (the loader gives the stored [C, K] that shape)
        return lambda w: _value_part(_tiled_to_grouped, w, qk, nk, nv)
    if kind == "ssm_out":
        return lambda w: untile(w, axis=1)
    return None


def hf_tensor(gguf_name: str, hf: dict):
    """(HF name as specrt's loaders spell it, transform) of a qwen35 GGUF tensor, or None for one specrt does not
    read."""
    base, _, suffix = gguf_name.rpartition(".")
    if gguf_name.endswith(".ssm_a"):  # stored without a .weight suffix
        base, suffix = gguf_name, ""
    if not base.startswith("blk."):
        top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}.get(base)
        return (f"{top}.{suffix}", (lambda w: w - 1.0) if base == "output_norm" else None) if top else None
    _, idx, kind = base.split(".", 2)
    if not idx.isdigit():
        return None
    layer, layers = int(idx), hf["num_hidden_layers"]
    transform = _reader_transform(kind, hf)
    if layer >= layers:  # the MTP module
        if layer > layers:
            return None  # only the first module is read
        if kind in NEXTN:
            return f"model.mtp.{NEXTN[kind]}.{suffix}", transform
        return (f"model.mtp.layers.0.{SHARED[kind]}.{suffix}", transform) if kind in SHARED else None
    name = SHARED.get(kind) or LINEAR.get(kind)
    if name is None:
        return None
    full = f"model.layers.{layer}.{name}"
    return (f"{full}.{suffix}" if suffix and kind != "ssm_dt" else full), transform  # ssm_dt.bias is HF's dt_bias


def gguf_name(hf_name: str, hf: dict) -> tuple[str, str]:
    """(GGUF name, tensor kind) of an HF tensor name (mtp.* or model.mtp.* for the MTP module)."""
    layers = hf["num_hidden_layers"]
    if hf_name.startswith(("mtp.", "model.mtp.")):
        rest = hf_name.split("mtp.", 1)[1]
        base, _, suffix = rest.rpartition(".")
        nextn = {v: k for k, v in NEXTN.items()}
        kind = nextn[base] if base in nextn else {v: k for k, v in SHARED.items()}[base[len("layers.0."):]]
        return f"blk.{layers}.{kind}.{suffix}", kind
    base, _, suffix = hf_name.rpartition(".")
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if base in top:
        return f"{top[base]}.{suffix}", top[base]
    if hf_name.endswith(("A_log", "dt_bias")):
        idx = hf_name.split(".")[2]
        return (f"blk.{idx}.ssm_a", "ssm_a") if hf_name.endswith("A_log") else (f"blk.{idx}.ssm_dt.bias", "ssm_dt")
    _, _, idx, rest = base.split(".", 3)
    kind = {**{v: k for k, v in SHARED.items()}, **{v: k for k, v in LINEAR.items()}}[rest]
    return f"blk.{idx}.{kind}.{suffix}", kind


def gguf_tensor(hf_name: str, w: np.ndarray, hf: dict) -> tuple[str, np.ndarray]:
    """(GGUF name, array as llama.cpp's converter stores it) of an HF tensor (the writer's direction)."""
    nk, nv = hf["linear_num_key_heads"], hf["linear_num_value_heads"]
    qk = 2 * nk * hf["linear_key_head_dim"]
    tile = functools.partial(_grouped_to_tiled, key_heads=nk, value_heads=nv)
    name, kind = gguf_name(hf_name, hf)
    w = np.asarray(w, dtype=np.float32)
    if kind == "ffn_gate_inp_shexp":  # one row [1, hidden], stored as a vector
        w = w.reshape(-1)
    if kind in PLUS_ONE or kind == "output_norm":
        w = w + 1.0
    elif kind in ("attn_gate", "ssm_beta", "ssm_alpha", "ssm_dt"):
        w = tile(w)
    elif kind == "ssm_a":
        w = -np.exp(tile(w))
    elif kind == "attn_qkv":
        w = _value_part(_grouped_to_tiled, w, qk, nk, nv)
    elif kind == "ssm_conv1d":
        w = _value_part(_grouped_to_tiled, w.reshape(w.shape[0], -1), qk, nk, nv)
    elif kind == "ssm_out":
        w = tile(w, axis=1)
    return name, np.ascontiguousarray(w, dtype=np.float32)


def stacked_experts(weights: dict[str, np.ndarray], hf: dict, fused: bool = False) -> dict[str, np.ndarray]:
    """The experts of HF per-expert tensors (model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight, and
    mtp.layers.0.mlp.experts... for the MTP block) stacked as qwen35moe stores them: GGUF name -> [E, rows, cols]
    (the writer's direction); fused: gate and up as one ffn_gate_up_exps [E, 2 x rows, cols]."""
    import re

    groups: dict[str, dict[int, np.ndarray]] = {}
    for name, w in weights.items():
        m = re.match(r"(?:model\.)?(?:layers\.(\d+)|mtp\.layers\.0)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$",
                     name)
        if m:
            block = int(m.group(1)) if m.group(1) is not None else hf["num_hidden_layers"]
            groups.setdefault(f"blk.{block}.ffn_{m.group(3)}_exps.weight", {})[int(m.group(2))] = w
    out = {name: np.ascontiguousarray(np.stack([parts[e] for e in sorted(parts)]), dtype=np.float32)
           for name, parts in groups.items()}
    if fused:
        for gate in [n for n in out if n.endswith(".ffn_gate_exps.weight")]:
            up = gate.replace("ffn_gate_exps", "ffn_up_exps")
            out[gate.replace("ffn_gate_exps", FUSED_EXPERTS)] = np.ascontiguousarray(
                np.concatenate([out.pop(gate), out.pop(up)], axis=1))
    return out


def write_metadata(writer, hf: dict, mtp_layers: int) -> None:
    """The qwen35 (or, for a qwen3_5_moe_text config, qwen35moe) keys llama.cpp's converter writes, on a
    gguf.GGUFWriter made with that arch (hf: a config dict as config_from_hf reads it)."""
    from specrt.models.config import config_from_hf

    c = config_from_hf(hf)
    arch = MOE_ARCH if c.num_experts else ARCH
    rope = hf.get("rope_parameters") or {}
    writer.add_block_count(c.num_layers + mtp_layers)
    writer.add_context_length(c.max_position)
    writer.add_embedding_length(c.hidden_size)
    if c.num_experts:
        writer.add_expert_count(c.num_experts)
        writer.add_expert_used_count(c.experts_per_token)
        writer.add_expert_feed_forward_length(c.moe_intermediate_size)
        writer.add_expert_shared_feed_forward_length(c.shared_expert_size)
    else:
        writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(float(c.rope.theta))
    writer.add_rope_dimension_count(c.rotary_dim)
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    writer.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    writer.add_uint32(f"{arch}.ssm.conv_kernel", c.linear_conv_kernel)
    writer.add_uint32(f"{arch}.ssm.state_size", c.linear_key_dim)
    writer.add_uint32(f"{arch}.ssm.group_count", c.linear_key_heads)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", c.linear_value_heads)
    writer.add_uint32(f"{arch}.ssm.inner_size", c.linear_value_heads * c.linear_value_dim)
    writer.add_array(f"{arch}.attention.recurrent_layers",
                     [c.is_linear(i) for i in range(c.num_layers)] + [False] * mtp_layers)
    writer.add_uint32(f"{arch}.full_attention_interval", int(hf.get("full_attention_interval", 4)))
    if mtp_layers:
        writer.add_uint32(f"{arch}.nextn_predict_layers", mtp_layers)
