"""Write a real-size model with random weights, and its drafter, in the published layouts (streaming: it never
holds more than one chunk of one tensor, so writing an 8B model needs a few hundred MB, not 16 GB).

    python scripts/synthetic_model.py llama-3.1-8b OUT    # OUT/target (bf16, 4 shards + index) + OUT/eagle3
    python scripts/synthetic_model.py qwen3-8b OUT        # OUT/target (bf16, 5 shards + index) + OUT/dflash
    python scripts/synthetic_model.py llama-3.2-1b OUT    # OUT/target (bf16, one shard + index) + OUT/eagle3
    python scripts/synthetic_model.py qwen3.5-9b OUT      # OUT/target (bf16, multimodal layout, MTP) + OUT/dflash
    python scripts/synthetic_model.py qwen3-30b-a3b OUT --layers 4   # MoE (128 experts) at real width + OUT/dflash
    python scripts/synthetic_model.py gemma4-e4b OUT      # OUT/target (bf16, multimodal layout's text) + OUT/assistant
    python scripts/synthetic_model.py gemma4-26b-a4b OUT --layers 6   # MoE beside a dense MLP + OUT/assistant
    options: --layers N (fewer target layers, same widths), --tiny (every width divided: a test-size twin)

The configs are the published ones (random weights: acceptance means nothing; memory, time, speed and
losslessness do):
- meta-llama/Llama-3.1-8B-Instruct, config.json: hidden 4096, 32 layers, intermediate 14336, 32 heads / 8 KV
  heads, vocab 128256, rope_theta 500000 with rope_scaling {rope_type llama3, factor 8, low_freq_factor 1,
  high_freq_factor 4, original_max_position_embeddings 8192}, rms_norm_eps 1e-5, untied embeddings, bf16,
  model-0000{1..4}-of-00004.safetensors + model.safetensors.index.json.
- meta-llama/Llama-3.2-1B-Instruct (the 1B class, for bench/gpu.sh), config.json: hidden 2048, 16 layers,
  intermediate 8192, 32 heads / 8 KV heads, head_dim 64, vocab 128256, rope_theta 500000 with rope_scaling
  {rope_type llama3, factor 32, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192},
  rms_norm_eps 1e-5, tied embeddings, bf16. Its EAGLE-3 head here has the 8B head's layout (below) at the 1B's
  widths.
- yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (the EAGLE-3 authors' head; SafeAILab/EAGLE eagle/traineagle3/config.json),
  config.json: LlamaForCausalLM (SGLang's copies say LlamaForCausalLMEagle3), one layer of the target's widths,
  max_position_embeddings 2048, no rope keys, draft_vocab_size 32000, float16. Published as pytorch_model.bin,
  which specrt never unpickles: written here as the model.safetensors its safetensors copies hold. Tensors fc.weight [4096, 3 * 4096],
  midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight, midlayer.self_attn.{q,k,v}_proj
  reading 2 * 4096 features, o_proj, midlayer.mlp.*, norm.weight, lm_head.weight [32000, 4096], d2t [32000]
  int64 (draft id d is target id d + d2t[d]), t2d [128256] bool; no embedding (the target's is used).
- Qwen/Qwen3-8B, config.json: hidden 4096, 36 layers, intermediate 12288, 32 heads / 8 KV heads, head_dim 128,
  q/k norm, vocab 151936, rope_theta 1000000, rms_norm_eps 1e-6, untied embeddings, bf16, 5 shards.
- z-lab/Qwen3-8B-DFlash-b16 (DFlash's authors; as vllm-project/speculators' converter tests and z-lab/dflash's
  model code describe it), config.json: DFlashDraftModel, 5 Qwen3 layers of the
  target's widths, block_size 16, dflash_config {mask_token_id 151669, target_layer_ids [1, 9, 17, 25, 33]}
  (z-lab's build_target_layer_ids for 36 target layers and 5 draft layers: round(1 + i * 32 / 4)), bf16;
  tensors fc.weight [4096, 5 * 4096], hidden_norm.weight, norm.weight, layers.{i}.{input_layernorm,
  post_attention_layernorm}.weight, layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm
  .weight, layers.{i}.mlp.{gate,up,down}_proj.weight; no embedding or lm_head (the target's are shared).

- Qwen/Qwen3-30B-A3B, config.json: Qwen3MoeForCausalLM, hidden 2048, 48 layers, 32 heads / 4 KV heads of 128, q/k
  norm, 128 experts of width 768 (moe_intermediate_size), 8 routed a token, norm_topk_prob true, every layer sparse
  (decoder_sparse_step 1, mlp_only_layers []), vocab 151936, rope_theta 1000000, rms_norm_eps 1e-6, untied, bf16.
  Experts in the published per-expert names (model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight, the
  router mlp.gate.weight [128, 2048]). Its DFlash drafter is written as the Qwen3-8B one's layout at this model's
  widths (z-lab publishes one for Qwen3-Coder-30B-A3B; its exact widths are not assumed here).
- Qwen/Qwen3.5-9B, config.json: Qwen3_5ForConditionalGeneration, model_type qwen3_5; text_config (transformers'
  Qwen3_5TextConfig defaults, which are this model's): hidden 4096, 32 layers (layer_types: 3 linear_attention then
  1 full_attention, repeated), intermediate 12288, 16 heads / 4 KV heads, head_dim 256, vocab 248320, Gated
  DeltaNet 16 key heads / 32 value heads of 128, conv kernel 4, rope_parameters {rope_theta 10000000,
  partial_rotary_factor 0.25, mrope_section [11, 11, 10], mrope_interleaved}, rms_norm_eps 1e-6, untied,
  mtp_num_hidden_layers 1, eos 248044 (<|im_end|> 248046 ends a chat turn); vision_config depth 27, hidden 1152.
  Tensors: model.language_model.* (the text model), model.visual.* (its vision tower, listed from transformers'
  own class), lm_head.weight, mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm, layers.0.*} (one gated
  full-attention block). Norms and A_log / dt_bias are drawn as norms (A = exp(A_log) in [2.7, 7.4]).
- z-lab/Qwen3.5-9B-DFlash (its model card): DFlashDraftModel, 5 Qwen3 layers (hidden 4096, 32 heads; taken here
  as 8 KV heads of 128 and intermediate 12288, the Qwen3-8B drafter's), block_size 16, dflash_config
  {mask_token_id 248070, target_layer_ids [1, 8, 15, 22, 29]}, bf16, tensors as the Qwen3-8B drafter's.

- google/gemma-4-E4B (config.json as published, text_config): Gemma4ForConditionalGeneration, hidden 2560, 42
  layers (full attention at 5, 11, ..., 41, the rest sliding with window 512), intermediate 10240, 8 heads / 2 KV
  heads, head_dim 256, global_head_dim 512, attention_k_eq_v false, per-layer inputs 256 wide over a 262144-token
  table, num_kv_shared_layers 18, final_logit_softcapping 30, vocab 262144, tied, bf16, rope {sliding: default
  10000; full: proportional 0.25, 1e6}. Tensors under model.language_model.*; the shared layers keep their (unread)
  k/v projections as the published checkpoint does; its vision and audio towers are not written.
- google/gemma-4-26B-A4B: hidden 2816, 30 layers (full every 6th, window 1024), 16 heads / 8 KV heads, full layers
  2 KV heads of 512 with keys as values, a dense MLP of 2112 beside 128 experts of width 704 (8 a token) in every
  layer, no per-layer inputs, no KV sharing, vocab 262144, tied. Experts fused as published
  (experts.gate_up_proj [128, 1408, 2816], experts.down_proj [128, 2816, 704]).
- Their assistants (google/gemma-4-E4B-it-assistant, -26B-A4B-it-assistant: Gemma4AssistantForCausalLM): 4 layers
  (3 sliding, 1 full) of the target's head sizes and KV heads, reading the target's caches; E4B's: hidden 256,
  4 heads, ordered embeddings (2048 centroids, top 32); 26B-A4B's: hidden 1024, 8 heads, keys as values, a plain
  tied head. Their intermediate sizes (taken as 4 x hidden) and head counts are not from published configs.

Random values: every matrix entry is +-(1 + m / 128) * 2^-6 (m a random 7-bit mantissa, random sign), every
norm weight 1 + m / 128 (Gemma 4's q/k norms (1 + m / 128) / 8, its layer scalars (1 + m / 128) / 2: with attention
scale 1, unit q/k norms made every softmax a hard argmax, and the random model chaotic): small enough that activations stay finite through every layer, cheap to draw.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHARD_BYTES = 5 * 10**9  # HF's usual shard size
CHUNK = 1 << 24  # values drawn at a time


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    kind: str  # "matrix" | "norm" | "d2t" | "t2d"
    dtype: str = "BF16"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * {"BF16": 2, "F16": 2, "I64": 8, "BOOL": 1}[self.dtype]


def _bits(rng, count: int, exponent: int) -> np.ndarray:
    """bf16 bit patterns +-(1 + m / 128) * 2^(exponent - 127) with random sign and mantissa."""
    r = np.frombuffer(rng.bytes(count), dtype=np.uint8).astype(np.uint16)
    return ((r & 0x80) << 8) | np.uint16(exponent << 7) | (r & 0x7F)


def _chunks(t: Tensor, rng, extra: dict):
    count = int(np.prod(t.shape, dtype=np.int64))
    if t.kind in ("d2t", "t2d", "ordering"):
        yield extra[t.kind].tobytes()
        return
    for lo in range(0, count, CHUNK):
        n = min(CHUNK, count - lo)
        if t.kind == "norm":
            bits = _bits(rng, n, 127) & np.uint16(0x7FFF)  # positive, in [1, 2)
        elif t.kind == "scalar":
            bits = _bits(rng, n, 126) & np.uint16(0x7FFF)  # positive, in [0.5, 1) (Gemma 4's layer scalars)
        elif t.kind == "qk_norm":  # positive, in [1/8, 1/4): Gemma 4's q/k norms (w, attention scale 1) keep q.k
            bits = _bits(rng, n, 124) & np.uint16(0x7FFF)  # near unit spread instead of sqrt(head_dim)
        else:
            bits = _bits(rng, n, 127 - 6)
        if t.dtype == "F16":
            yield (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float16).tobytes()
        else:
            yield bits.tobytes()


def write_safetensors(path: Path, tensors: list[Tensor], rng, extra: dict | None = None) -> None:
    """One safetensors file, header first (all sizes are known), then each tensor chunk by chunk."""
    header, offset = {}, 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors:
            for chunk in _chunks(t, rng, extra or {}):
                f.write(chunk)


def write_sharded(folder: Path, tensors: list[Tensor], rng) -> None:
    """model-0000k-of-0000n.safetensors shards of at most SHARD_BYTES + model.safetensors.index.json."""
    shards, current, size = [], [], 0
    for t in tensors:
        if current and size + t.nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    shards.append(current)
    weight_map = {}
    for k, part in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(folder / name, part, rng)
        weight_map.update({t.name: name for t in part})
        print(f"  {name}: {len(part)} tensors", file=sys.stderr)
    total = sum(t.nbytes for t in tensors)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def decoder_tensors(prefix: str, c: dict, qk_norm: bool, attn_in: int | None = None) -> list[Tensor]:
    h = c["hidden_size"]
    d = c.get("head_dim") or h // c["num_attention_heads"]
    attn_in = attn_in or h
    out = [Tensor(prefix + "input_layernorm.weight", (h,), "norm"),
           Tensor(prefix + "self_attn.q_proj.weight", (c["num_attention_heads"] * d, attn_in), "matrix"),
           Tensor(prefix + "self_attn.k_proj.weight", (c["num_key_value_heads"] * d, attn_in), "matrix"),
           Tensor(prefix + "self_attn.v_proj.weight", (c["num_key_value_heads"] * d, attn_in), "matrix"),
           Tensor(prefix + "self_attn.o_proj.weight", (h, c["num_attention_heads"] * d), "matrix")]
    if qk_norm:
        out += [Tensor(prefix + "self_attn.q_norm.weight", (d,), "norm"),
                Tensor(prefix + "self_attn.k_norm.weight", (d,), "norm")]
    return out + [Tensor(prefix + "post_attention_layernorm.weight", (h,), "norm"),
                  Tensor(prefix + "mlp.gate_proj.weight", (c["intermediate_size"], h), "matrix"),
                  Tensor(prefix + "mlp.up_proj.weight", (c["intermediate_size"], h), "matrix"),
                  Tensor(prefix + "mlp.down_proj.weight", (h, c["intermediate_size"]), "matrix")]


def moe_tensors(prefix: str, c: dict) -> list[Tensor]:
    """A Qwen3-MoE layer's MLP in the published per-expert layout: the router, then each expert's projections."""
    h, width = c["hidden_size"], c["moe_intermediate_size"]
    out = [Tensor(prefix + "mlp.gate.weight", (c["num_experts"], h), "matrix")]
    for e in range(c["num_experts"]):
        q = f"{prefix}mlp.experts.{e}."
        out += [Tensor(q + "gate_proj.weight", (width, h), "matrix"), Tensor(q + "up_proj.weight", (width, h), "matrix"),
                Tensor(q + "down_proj.weight", (h, width), "matrix")]
    return out


def target_tensors(c: dict, qk_norm: bool) -> list[Tensor]:
    h, v = c["hidden_size"], c["vocab_size"]
    out = [Tensor("model.embed_tokens.weight", (v, h), "matrix")]
    for i in range(c["num_hidden_layers"]):
        layer = decoder_tensors(f"model.layers.{i}.", c, qk_norm)
        if c.get("num_experts") and i not in c.get("mlp_only_layers", []):  # a mixture of experts for the MLP
            layer = [t for t in layer if ".mlp." not in t.name] + moe_tensors(f"model.layers.{i}.", c)
        out += layer
    out += [Tensor("model.norm.weight", (h,), "norm")]
    if not c["tie_word_embeddings"]:
        out += [Tensor("lm_head.weight", (v, h), "matrix")]
    return out


def llama_31_8b(tiny: bool) -> dict:
    c = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
         "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
         "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
         "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
         "vocab_size": 128256, "head_dim": 128}
    if tiny:
        c.update(hidden_size=256, intermediate_size=896, num_attention_heads=2, num_key_value_heads=1,
                 vocab_size=4096, bos_token_id=1, eos_token_id=[2])
    return c


def llama_32_1b(tiny: bool) -> dict:
    c = llama_31_8b(tiny)
    c.update(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64, tie_word_embeddings=True,
             rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    if tiny:
        c.update(hidden_size=128, intermediate_size=512, num_attention_heads=2, num_key_value_heads=1)
    return c


def qwen3_8b(tiny: bool) -> dict:
    c = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
         "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
         "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
         "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
         "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
    if tiny:
        c.update(hidden_size=256, intermediate_size=768, num_attention_heads=2, num_key_value_heads=1,
                 vocab_size=4096, bos_token_id=1, eos_token_id=2)
    return c


def qwen3_30b_a3b(tiny: bool) -> dict:
    c = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
         "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
         "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
         "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
         "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
         "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
    if tiny:
        c.update(hidden_size=256, intermediate_size=768, moe_intermediate_size=128, num_attention_heads=2,
                 num_key_value_heads=1, num_experts=16, vocab_size=4096, bos_token_id=1, eos_token_id=2)
    return c


def qwen35_9b(tiny: bool) -> dict:
    """The published multimodal config; its text part is also what scripts read as the target's widths."""
    text = {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
            "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
            "tie_word_embeddings": False, "attention_bias": False, "attn_output_gate": True,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4,
            "mtp_num_hidden_layers": 1, "bos_token_id": None, "eos_token_id": 248044, "dtype": "bfloat16",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True}}
    vision = {"model_type": "qwen3_5", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
              "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "out_hidden_size": 4096, "num_position_embeddings": 2304,
              "hidden_act": "gelu_pytorch_tanh"}
    if tiny:
        text.update(hidden_size=256, intermediate_size=768, num_attention_heads=2, num_key_value_heads=1,
                    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=32, vocab_size=4096, eos_token_id=3)
        vision.update(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256)
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text,
            "vision_config": vision, "image_token_id": 248056, "video_token_id": 248057,
            "vision_start_token_id": 248053, "vision_end_token_id": 248054, "tie_word_embeddings": False}


def qwen35_tensors(c: dict, qk_norm: bool = True) -> list[Tensor]:
    """model.language_model.* (Gated DeltaNet and gated attention layers), model.visual.*, lm_head, mtp.*."""
    t = c["text_config"]
    h, v = t["hidden_size"], t["vocab_size"]
    hk, hv, dk, dv = (t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                      t["linear_value_head_dim"])
    channels = 2 * hk * dk + hv * dv
    gated = {**t, "num_attention_heads": 2 * t["num_attention_heads"]}  # q_proj emits query and gate per head

    def attention_block(prefix: str) -> list[Tensor]:
        block = decoder_tensors(prefix, gated, qk_norm=True)
        d = t["head_dim"]
        return [Tensor(x.name, (h, t["num_attention_heads"] * d), x.kind) if x.name.endswith("o_proj.weight")
                else x for x in block]

    out = [Tensor("model.language_model.embed_tokens.weight", (v, h), "matrix")]
    for i in range(t["num_hidden_layers"]):
        p = f"model.language_model.layers.{i}."
        if (i + 1) % t["full_attention_interval"]:
            la = p + "linear_attn."
            out += [Tensor(p + "input_layernorm.weight", (h,), "norm"),
                    Tensor(la + "in_proj_qkv.weight", (channels, h), "matrix"),
                    Tensor(la + "in_proj_z.weight", (hv * dv, h), "matrix"),
                    Tensor(la + "in_proj_b.weight", (hv, h), "matrix"),
                    Tensor(la + "in_proj_a.weight", (hv, h), "matrix"),
                    Tensor(la + "conv1d.weight", (channels, 1, t["linear_conv_kernel_dim"]), "matrix"),
                    Tensor(la + "A_log", (hv,), "norm"), Tensor(la + "dt_bias", (hv,), "norm"),
                    Tensor(la + "norm.weight", (dv,), "norm"),
                    Tensor(la + "out_proj.weight", (h, hv * dv), "matrix"),
                    *decoder_tensors(p, t, qk_norm=False)[5:]]  # post-attention norm and MLP
        else:
            out += attention_block(p)
    out += [Tensor("model.language_model.norm.weight", (h,), "norm"), Tensor("lm_head.weight", (v, h), "matrix")]
    out += vision_tensors(c)
    out += [Tensor("mtp.fc.weight", (h, 2 * h), "matrix"), Tensor("mtp.pre_fc_norm_embedding.weight", (h,), "norm"),
            Tensor("mtp.pre_fc_norm_hidden.weight", (h,), "norm"), *attention_block("mtp.layers.0."),
            Tensor("mtp.norm.weight", (h,), "norm")]
    return out


def vision_tensors(c: dict) -> list[Tensor]:
    """The vision tower's tensors as transformers' own class names and shapes them (built on the meta device)."""
    import torch
    import transformers as tf

    vision = {k: v for k, v in c["vision_config"].items() if k != "model_type"}
    with torch.device("meta"):
        tower = tf.models.qwen3_5.modeling_qwen3_5.Qwen3_5VisionModel(tf.Qwen3_5VisionConfig(**vision))
    return [Tensor("model.visual." + name, tuple(p.shape), "norm" if "norm" in name or name.endswith("bias")
                   else "matrix") for name, p in tower.state_dict().items()]


def write_qwen35_dflash(folder: Path, target: dict, rng) -> None:
    t = target["text_config"]
    tiny = t["hidden_size"] < 4096
    drafter = {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": t["eos_token_id"],
               "head_dim": 128 if not tiny else 64, "hidden_act": "silu", "hidden_size": t["hidden_size"],
               "initializer_range": 0.02, "intermediate_size": t["intermediate_size"],
               "max_position_embeddings": 262144, "num_attention_heads": 32 if not tiny else 4,
               "num_key_value_heads": 8 if not tiny else 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
               "rope_theta": 10000000, "tie_word_embeddings": False, "vocab_size": t["vocab_size"]}
    layers = 5
    layer_ids = [1, 8, 15, 22, 29] if t["num_hidden_layers"] == 32 else [
        int(round(1 + i * (t["num_hidden_layers"] - 4) / (layers - 1))) for i in range(layers)]
    mask_token = 248070 if t["vocab_size"] > 248070 else t["vocab_size"] - 1
    c = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
         "block_size": 16, "dflash_config": {"mask_token_id": mask_token, "target_layer_ids": layer_ids},
         **drafter, "model_type": "qwen3", "num_hidden_layers": layers,
         "num_target_layers": t["num_hidden_layers"], "torch_dtype": "bfloat16"}
    _write_dflash_folder(folder, c, rng)


def write_eagle3(folder: Path, target: dict, rng) -> None:
    h, v = target["hidden_size"], target["vocab_size"]
    draft_vocab = 32000 if v > 32000 else v // 4
    c = {"architectures": ["LlamaForCausalLM"], "bos_token_id": target["bos_token_id"],
         "eos_token_id": target["eos_token_id"][0], "hidden_act": "silu", "hidden_size": h,
         "initializer_range": 0.02, "intermediate_size": target["intermediate_size"],
         "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": target["num_attention_heads"],
         "num_key_value_heads": target["num_key_value_heads"],
         "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": target["rms_norm_eps"], "tie_word_embeddings": False,
         "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True, "vocab_size": v,
         "draft_vocab_size": draft_vocab}  # no rope keys: EAGLE's code then uses base 10000, unscaled
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    chosen = np.sort(rng.choice(v, size=draft_vocab, replace=False)).astype(np.int64)  # draft id -> target id
    t2d = np.zeros(v, dtype=bool)
    t2d[chosen] = True
    layer = decoder_tensors("midlayer.", c, qk_norm=False, attn_in=2 * h)
    layer.insert(1, Tensor("midlayer.hidden_norm.weight", (h,), "norm"))
    tensors = [Tensor("fc.weight", (h, 3 * h), "matrix"), *layer, Tensor("norm.weight", (h,), "norm"),
               Tensor("lm_head.weight", (draft_vocab, h), "matrix"),
               Tensor("d2t", (draft_vocab,), "d2t", "I64"), Tensor("t2d", (v,), "t2d", "BOOL")]
    tensors = [t if t.dtype != "BF16" else Tensor(t.name, t.shape, t.kind, "F16") for t in tensors]
    write_safetensors(folder / "model.safetensors", tensors, rng,
                      {"d2t": chosen - np.arange(draft_vocab, dtype=np.int64), "t2d": t2d})


def write_dflash(folder: Path, target: dict, rng) -> None:
    layers, block = 5, 16
    n = target["num_hidden_layers"]
    start, end = 1, n - 3
    layer_ids = [int(round(start + i * (end - start) / (layers - 1))) for i in range(layers)]
    mask_token = 151669 if target["vocab_size"] > 151669 else target["vocab_size"] - 1
    c = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
         "block_size": block, "dflash_config": {"mask_token_id": mask_token, "target_layer_ids": layer_ids},
         **{k: target[k] for k in ("attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
                                   "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
                                   "max_position_embeddings", "num_attention_heads", "num_key_value_heads",
                                   "rms_norm_eps", "rope_scaling", "rope_theta", "tie_word_embeddings",
                                   "vocab_size")},
         "model_type": "qwen3", "num_hidden_layers": layers, "num_target_layers": n, "torch_dtype": "bfloat16"}
    _write_dflash_folder(folder, c, rng)


def _write_dflash_folder(folder: Path, c: dict, rng) -> None:
    """A DFlash drafter in z-lab's layout from its config c: config.json, then fc [H, layers * H], hidden_norm, the
    Qwen3 layers and the final norm (no embedding or lm_head: the target's are shared)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    tensors = [Tensor("fc.weight", (h, layers * h), "matrix"), Tensor("hidden_norm.weight", (h,), "norm")]
    for i in range(layers):
        tensors += decoder_tensors(f"layers.{i}.", c, qk_norm=True)
    tensors += [Tensor("norm.weight", (h,), "norm")]
    write_safetensors(folder / "model.safetensors", tensors, rng)


def GEMMA4_LAYER_TYPES(n: int) -> list[str]:  # noqa: N802
    """Every 6th layer full, and the last (transformers forces it full)."""
    return ["full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention" for i in range(n)]
GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}


def gemma4_e4b(tiny: bool) -> dict:
    text = {"model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 42, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
            "global_head_dim": 512, "attention_k_eq_v": False, "hidden_size_per_layer_input": 256,
            "vocab_size_per_layer_input": 262144, "num_kv_shared_layers": 18, "sliding_window": 512,
            "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06,
            "max_position_embeddings": 131072, "tie_word_embeddings": True, "use_double_wide_mlp": False,
            "enable_moe_block": False, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
            "rope_parameters": GEMMA4_ROPE, "dtype": "bfloat16"}
    if tiny:
        text.update(vocab_size=4096, vocab_size_per_layer_input=4096, hidden_size=256, intermediate_size=512,
                    head_dim=64, global_head_dim=128, hidden_size_per_layer_input=32, sliding_window=64)
    return _gemma4(text)


def gemma4_26b_a4b(tiny: bool) -> dict:
    text = {"model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
            "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
            "global_head_dim": 512, "num_global_key_value_heads": 2, "attention_k_eq_v": True,
            "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 262144, "num_kv_shared_layers": 0,
            "sliding_window": 1024, "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-06, "max_position_embeddings": 262144, "tie_word_embeddings": True,
            "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
            "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "rope_parameters": GEMMA4_ROPE,
            "dtype": "bfloat16"}
    if tiny:
        text.update(vocab_size=4096, hidden_size=256, intermediate_size=256, head_dim=64, global_head_dim=128,
                    num_experts=16, moe_intermediate_size=64, sliding_window=64)
    return _gemma4(text)


def _gemma4(text: dict) -> dict:
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
            "tie_word_embeddings": True}


def gemma4_tensors(c: dict) -> list[Tensor]:
    """model.language_model.*: the embedding tables, then each layer (q/k/v of its kind's head size, k and v kept
    on the shared layers as the published checkpoint keeps them; dense MLP; per-layer input projections; MoE)."""
    t = c["text_config"]
    h, v, n_layers = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"]
    ple = t["hidden_size_per_layer_input"]
    types = t.setdefault("layer_types", GEMMA4_LAYER_TYPES(n_layers))
    p0 = "model.language_model."
    out = [Tensor(p0 + "embed_tokens.weight", (v, h), "matrix")]
    if ple:
        out += [Tensor(p0 + "embed_tokens_per_layer.weight", (t["vocab_size_per_layer_input"], n_layers * ple), "matrix"),
                Tensor(p0 + "per_layer_model_projection.weight", (n_layers * ple, h), "matrix"),
                Tensor(p0 + "per_layer_projection_norm.weight", (ple,), "norm")]
    for i, kind in enumerate(types):
        p = f"{p0}layers.{i}."
        full = kind == "full_attention"
        d = t["global_head_dim"] if full else t["head_dim"]
        kv = t.get("num_global_key_value_heads") if full and t["attention_k_eq_v"] else t["num_key_value_heads"]
        out += [Tensor(p + "input_layernorm.weight", (h,), "norm"),
                Tensor(p + "self_attn.q_proj.weight", (t["num_attention_heads"] * d, h), "matrix"),
                Tensor(p + "self_attn.q_norm.weight", (d,), "qk_norm"),
                Tensor(p + "self_attn.k_proj.weight", (kv * d, h), "matrix"),
                Tensor(p + "self_attn.k_norm.weight", (d,), "qk_norm")]
        if not (full and t["attention_k_eq_v"]):
            out.append(Tensor(p + "self_attn.v_proj.weight", (kv * d, h), "matrix"))
        out += [Tensor(p + "self_attn.o_proj.weight", (h, t["num_attention_heads"] * d), "matrix"),
                Tensor(p + "post_attention_layernorm.weight", (h,), "norm"),
                Tensor(p + "pre_feedforward_layernorm.weight", (h,), "norm"),
                Tensor(p + "mlp.gate_proj.weight", (t["intermediate_size"], h), "matrix"),
                Tensor(p + "mlp.up_proj.weight", (t["intermediate_size"], h), "matrix"),
                Tensor(p + "mlp.down_proj.weight", (h, t["intermediate_size"]), "matrix"),
                Tensor(p + "post_feedforward_layernorm.weight", (h,), "norm"),
                Tensor(p + "layer_scalar", (1,), "scalar")]
        if ple:
            out += [Tensor(p + "per_layer_input_gate.weight", (ple, h), "matrix"),
                    Tensor(p + "per_layer_projection.weight", (h, ple), "matrix"),
                    Tensor(p + "post_per_layer_input_norm.weight", (h,), "norm")]
        if t.get("enable_moe_block"):
            e, w = t["num_experts"], t["moe_intermediate_size"]
            out += [Tensor(p + "router.proj.weight", (e, h), "matrix"), Tensor(p + "router.scale", (h,), "norm"),
                    Tensor(p + "router.per_expert_scale", (e,), "norm"),
                    Tensor(p + "experts.gate_up_proj", (e, 2 * w, h), "matrix"),
                    Tensor(p + "experts.down_proj", (e, h, w), "matrix")]
            out += [Tensor(p + n + ".weight", (h,), "norm") for n in (
                "pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2")]
    return out + [Tensor(p0 + "norm.weight", (h,), "norm")]


def write_gemma4_assistant(folder: Path, target: dict, rng) -> None:
    """The target's assistant (see the module docstring): config.json + model.safetensors."""
    t = target["text_config"]
    e4b = bool(t["hidden_size_per_layer_input"])
    hidden = (256 if e4b else 1024) if t["hidden_size"] > 1024 else 64
    heads = 4 if e4b else 8
    centroids = 2048 if t["vocab_size"] % 2048 == 0 else 64
    text = {**{k: t[k] for k in ("vocab_size", "head_dim", "global_head_dim", "num_key_value_heads", "sliding_window",
                                 "attention_k_eq_v", "rms_norm_eps", "rope_parameters", "hidden_activation")},
            "model_type": "gemma4_text", "hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": 4,
            "num_attention_heads": heads, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "num_kv_shared_layers": 4,
            "enable_moe_block": False, "use_double_wide_mlp": False, "tie_word_embeddings": True}
    if t.get("num_global_key_value_heads"):
        text["num_global_key_value_heads"] = t["num_global_key_value_heads"]
    c = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant", "text_config": text,
         "backbone_hidden_size": t["hidden_size"], "use_ordered_embeddings": e4b, "num_centroids": centroids,
         "centroid_intermediate_top_k": 32 if centroids == 2048 else 8, "tie_word_embeddings": True}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    tensors = [Tensor("model.embed_tokens.weight", (t["vocab_size"], hidden), "matrix")]
    for i, kind in enumerate(text["layer_types"]):
        p = f"model.layers.{i}."
        d = t["global_head_dim"] if kind == "full_attention" else t["head_dim"]
        tensors += [Tensor(p + "input_layernorm.weight", (hidden,), "norm"),
                    Tensor(p + "self_attn.q_proj.weight", (heads * d, hidden), "matrix"),
                    Tensor(p + "self_attn.q_norm.weight", (d,), "qk_norm"),
                    Tensor(p + "self_attn.o_proj.weight", (hidden, heads * d), "matrix"),
                    Tensor(p + "post_attention_layernorm.weight", (hidden,), "norm"),
                    Tensor(p + "pre_feedforward_layernorm.weight", (hidden,), "norm"),
                    Tensor(p + "mlp.gate_proj.weight", (4 * hidden, hidden), "matrix"),
                    Tensor(p + "mlp.up_proj.weight", (4 * hidden, hidden), "matrix"),
                    Tensor(p + "mlp.down_proj.weight", (hidden, 4 * hidden), "matrix"),
                    Tensor(p + "post_feedforward_layernorm.weight", (hidden,), "norm"),
                    Tensor(p + "layer_scalar", (1,), "scalar")]
    tensors += [Tensor("model.norm.weight", (hidden,), "norm"),
                Tensor("pre_projection.weight", (hidden, 2 * t["hidden_size"]), "matrix"),
                Tensor("post_projection.weight", (t["hidden_size"], hidden), "matrix")]
    extra = {}
    if e4b:
        tensors += [Tensor("masked_embedding.centroids.weight", (centroids, hidden), "matrix"),
                    Tensor("masked_embedding.token_ordering", (t["vocab_size"],), "ordering", "I64")]
        extra["ordering"] = rng.permutation(t["vocab_size"]).astype(np.int64)
    write_safetensors(folder / "model.safetensors", tensors, rng, extra)


LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(folder: Path, cfg: dict, preset: str) -> None:
    """A byte-level tokenizer of the model's vocabulary size (the published tokenizers cannot be fetched here):
    the 256 byte symbols, the published special tokens at their published ids (or small ids in a --tiny twin),
    placeholder tokens for the rest. Every text encodes (one token per byte), every id decodes."""
    if cfg.get("model_type") == "gemma4":
        return _write_gemma4_tokenizer(folder, cfg)
    if "text_config" in cfg:  # Qwen3.5: the text config holds the vocabulary
        return _write_qwen35_tokenizer(folder, cfg)
    v = cfg["vocab_size"]
    llama = preset.startswith("llama")
    if llama:
        names = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                 "<|eot_id|>"]
        ids = [128000, 128001, 128006, 128007, 128008, 128009] if v > 128009 else [1, 2, 3, 4, 5, 6]
        bos, eos, template = names[0], names[5], LLAMA3_TEMPLATE
    else:
        names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        ids = [151643, 151644, 151645] if v > 151645 else [1, 2, 3]
        bos, eos, template = None, names[2], CHATML_TEMPLATE
    if llama and v <= 128009:
        cfg_ids = {"bos_token_id": 1, "eos_token_id": [6]}
    elif not llama and v <= 151645:
        cfg_ids = {"bos_token_id": 1, "eos_token_id": 3}
    else:
        cfg_ids = {}
    if cfg_ids:  # the twin's config names its own special ids
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **cfg_ids}, indent=2))
    _byte_level_tokenizer(folder, v, names, ids, bos, eos, template)


def _byte_level_tokenizer(folder: Path, v: int, names: list[str], ids: list[int], bos, eos: str, template: str,
                          plain: tuple[str, ...] = ()) -> None:
    """tokenizer.json + tokenizer_config.json: the special tokens `names` at `ids`, the 256 byte symbols, placeholder
    tokens for the rest of the v ids; the tokens in `plain` (a reasoning model's <think>, </think>) are added but not
    special, so that decoding shows them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = dict(zip(names, ids))
    free = (i for i in range(v) if i not in set(ids))
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = next(free)
    for i in free:
        vocab[f"<|placeholder_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([n for n in names if n not in plain])
    if plain:
        tok.add_tokens(list(plain))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": bos, "eos_token": eos, "chat_template": template}, indent=2))


QWEN35_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


def _write_qwen35_tokenizer(folder: Path, cfg: dict) -> None:
    """Byte-level placeholder tokenizer at the Qwen3.5 vocabulary size, its special tokens at their published ids
    (<|endoftext|> 248044, <|im_start|> 248045, <|im_end|> 248046, <think> 248068, </think> 248069)."""
    v = cfg["text_config"]["vocab_size"]
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    ids = [248044, 248045, 248046, 248068, 248069] if v > 248069 else [1, 2, 3, 4, 5]
    _byte_level_tokenizer(folder, v, names, ids, None, "<|im_end|>", QWEN35_TEMPLATE, plain=("<think>", "</think>"))


GEMMA4_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def _write_gemma4_tokenizer(folder: Path, cfg: dict) -> None:
    """Byte-level placeholder tokenizer at Gemma's vocabulary size, its special tokens at their ids (<pad> 0, <eos> 1,
    <bos> 2, <start_of_turn> 105, <end_of_turn> 106)."""
    v = cfg["text_config"]["vocab_size"]
    names = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    _byte_level_tokenizer(folder, v, names, [0, 1, 2, 105, 106], "<bos>", "<end_of_turn>", GEMMA4_TEMPLATE)


PRESETS = {"llama-3.1-8b": (llama_31_8b, False, write_eagle3, "eagle3"),
           "llama-3.2-1b": (llama_32_1b, False, write_eagle3, "eagle3"),
           "qwen3-8b": (qwen3_8b, True, write_dflash, "dflash"),
           "qwen3.5-9b": (qwen35_9b, True, write_qwen35_dflash, "dflash"),
           "qwen3-30b-a3b": (qwen3_30b_a3b, True, write_dflash, "dflash"),
           "gemma4-e4b": (gemma4_e4b, True, write_gemma4_assistant, "assistant"),
           "gemma4-26b-a4b": (gemma4_26b_a4b, True, write_gemma4_assistant, "assistant")}


def preset_config(preset: str, tiny: bool = False, layers: int | None = None) -> dict:
    """The preset's HF config, at `layers` target layers where given (default: the published count)."""
    cfg = PRESETS[preset][0](tiny)
    if layers:
        (cfg.get("text_config") or cfg)["num_hidden_layers"] = layers
        text = cfg.get("text_config") or {}
        if text.get("num_kv_shared_layers"):  # Gemma 4 E4B: the first 6 layers (the 6th full) keep their caches
            if layers < 8:
                raise SystemExit("gemma4-e4b needs --layers 8 or more (6 cached layers, then shared ones)")
            text["num_kv_shared_layers"] = min(text["num_kv_shared_layers"], layers - 6)
        if "max_window_layers" in cfg:
            cfg["max_window_layers"] = layers
    return cfg


def preset_tensors(cfg: dict, qk_norm: bool) -> list[Tensor]:
    """The target's tensors for a preset's config (Gemma 4's also set its text_config.layer_types)."""
    if cfg.get("model_type") == "gemma4":
        return gemma4_tensors(cfg)
    return qwen35_tensors(cfg) if "text_config" in cfg else target_tensors(cfg, qk_norm)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", type=Path, help="a new folder")
    ap.add_argument("--layers", type=int, help="target layers (default: the published count)")
    ap.add_argument("--tiny", action="store_true", help="divide every width: a test-size twin of the layout")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    config_of, qk_norm, write_drafter, drafter = PRESETS[args.preset]
    cfg = preset_config(args.preset, args.tiny, args.layers)
    rng = np.random.default_rng(args.seed)
    target = args.out / "target"
    target.mkdir(parents=True)
    tensors = preset_tensors(cfg, qk_norm)
    (target / "config.json").write_text(json.dumps(cfg, indent=2))
    print(f"{args.preset}: {sum(int(np.prod(t.shape)) for t in tensors) / 1e9:.2f}B parameters -> {target}",
          file=sys.stderr)
    write_sharded(target, tensors, rng)
    write_tokenizer(target, cfg, args.preset)
    write_drafter(args.out / drafter, cfg, rng)
    print(f"{drafter} drafter -> {args.out / drafter}", file=sys.stderr)


if __name__ == "__main__":
    main()
