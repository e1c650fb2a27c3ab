"""Build the target's ONNX graph from a ModelConfig and HF-named numpy weights, with fused ORT ops.

The graph follows onnxruntime-genai's I/O names and fused-operator choices, plus what speculative
decoding needs:

inputs   input_ids [B, S] int64, position_ids [B, S] int64,
         attention_mask [B, T] int64 (T = past + new; only its row sums and width are read),
         attention_bias [B, 1, S, T] float (additive; zeros for a chain, -inf hides tree non-ancestors),
         sliding_attention_bias [B, 1, S, T] (models with sliding-window layers only): the same plus
           -inf where the key's position is `sliding_window` or more behind the query's. The window is
           counted in positions, not cache slots, so tree tokens (several per position) stay exact.
         past_key_values.{i}.key|value [B, KV, M, D] (M = the preallocated max context)
outputs  logits [B, S, V] float32 (every input position), present.{i}.key|value [B, KV, M, D],
         hidden_states [B, S, len(taps) * H] when taps are requested

Per layer: SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization, one fused QKV MatMul,
GroupQueryAttention with rotary inside (explicit position_ids, so tree tokens get their depth) and a
past/present buffer that the runtime binds to one OrtValue (the cache is written in place, never
copied), one fused gate/up MatMul. int4 turns every projection and the lm_head into MatMulNBits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from specrt.convert.onnx_graph import MS_DOMAIN, GraphWriter
from specrt.convert.quantize import Int4Weight, concat_rows, quantize_int4
from specrt.models.config import ModelConfig

PRECISIONS = ("fp32", "fp16", "int4")


@dataclass(frozen=True)
class GraphOptions:
    precision: str = "fp32"
    max_context: int = 2048
    hidden_layers: tuple[int, ...] = ()  # residual stream after these layers -> hidden_states
    int4_block_size: int = 32
    int4_accuracy_level: int = 4  # int8 activations in MatMulNBits (fast on AVX2/AVX512 CPUs)


def io_names(cfg: ModelConfig) -> dict:
    num_layers = cfg.num_layers
    sliding = ["sliding_attention_bias"] if cfg.active_sliding_window else []
    return {
        "inputs": ["input_ids", "position_ids", "attention_mask", "attention_bias"] + sliding,
        "past_key": [f"past_key_values.{i}.key" for i in range(num_layers)],
        "past_value": [f"past_key_values.{i}.value" for i in range(num_layers)],
        "present_key": [f"present.{i}.key" for i in range(num_layers)],
        "present_value": [f"present.{i}.value" for i in range(num_layers)],
        "logits": "logits",
        "hidden_states": "hidden_states",
    }


class _TargetBuilder:
    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], opts: GraphOptions, quantized: dict | None):
        if opts.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.cfg, self.w, self.opts = cfg, weights, opts
        self.g = GraphWriter("specrt_target")
        self.dtype = np.float16 if opts.precision == "fp16" else np.float32
        self.elem = TensorProto.FLOAT16 if opts.precision == "fp16" else TensorProto.FLOAT
        self.rope_caches: dict = {}
        self.quantized: dict[str, Int4Weight] = quantized or {}

    def int4(self, name: str) -> Int4Weight:
        if name not in self.quantized:
            self.quantized[name] = quantize_int4(self.w[name].astype(np.float32), self.opts.int4_block_size)
        return self.quantized[name]

    # -- weights -------------------------------------------------------------------------------
    def param(self, name: str, offset: float = 0.0) -> str:
        return self.g.weight(name, (self.w[name].astype(np.float32) + offset).astype(self.dtype))

    def linear(self, x: str, names: list[str], out_name: str) -> str:
        """y = x @ concat(W_names).T (+ bias), W in HF layout [out, in]; fused when several names."""
        biases = [self.w.get(n + ".bias") for n in names]
        bias = np.concatenate(biases).astype(self.dtype) if all(b is not None for b in biases) else None
        if self.opts.precision == "int4":
            q = concat_rows([self.int4(n + ".weight") for n in names])
            ins = [
                x,
                self.g.weight(out_name + ".qweight", q.packed),
                self.g.weight(out_name + ".scales", q.scales.astype(self.dtype)),
                self.g.weight(out_name + ".zero_points", q.zero_points),
                "",
                self.g.weight(out_name + ".bias", bias) if bias is not None else "",
            ]
            return self.g.op(
                "MatMulNBits", ins, domain=MS_DOMAIN, name=out_name, K=q.k, N=q.n, bits=4,
                block_size=q.block_size, accuracy_level=self.opts.int4_accuracy_level,
            )
        w = np.concatenate([self.w[n + ".weight"] for n in names], axis=0).astype(np.float32)
        y = self.g.op("MatMul", [x, self.g.weight(out_name + ".weight_t", w.T.astype(self.dtype))], name=out_name)
        if bias is not None:
            y = self.g.op("Add", [y, self.g.weight(out_name + ".bias", bias)])
        return y

    # -- blocks --------------------------------------------------------------------------------
    def norm(self, x: str, weight: str) -> str:
        w = self.param(weight, self.cfg.norm_offset)
        return self.g.op("SimplifiedLayerNormalization", [x, w], axis=-1, epsilon=self.cfg.rms_norm_eps, stash_type=1)

    def norm_with_skip(self, pending: str | None, residual: str, weight: str) -> tuple[str, str]:
        """Normalize residual + pending; returns (normed, new residual)."""
        if pending is None:
            return self.norm(residual, weight), residual
        w = self.param(weight, self.cfg.norm_offset)
        outs = self.g.op(
            "SkipSimplifiedLayerNormalization", [pending, residual, w],
            outputs=4, domain=MS_DOMAIN, epsilon=self.cfg.rms_norm_eps,
        )
        return outs[0], outs[3]

    def head_norm(self, x: str, heads: int, weight: str) -> str:
        """RMSNorm over head_dim: [B, S, heads * D] -> same shape."""
        d = self.cfg.head_dim
        x4 = self.g.op("Reshape", [x, self.g.const([0, 0, heads, d])])
        y = self.norm(x4, weight)
        return self.g.op("Reshape", [y, self.g.const([0, 0, heads * d])])

    def rope_cache(self, layer: int) -> tuple[str, str]:
        rope = self.cfg.rope_for(layer)
        if rope not in self.rope_caches:
            inv = np.array(rope.inv_freq(self.cfg.head_dim), dtype=np.float64)
            limit = max(self.opts.max_context, 1)
            angles = np.arange(limit, dtype=np.float64)[:, None] * inv[None]  # [M, D/2]
            self.rope_caches[rope] = (
                self.g.weight("cos_cache", np.cos(angles).astype(self.dtype)),
                self.g.weight("sin_cache", np.sin(angles).astype(self.dtype)),
            )
        return self.rope_caches[rope]

    def attention(self, i: int, h: str, io: dict, seqlens_k: str, total_len: str) -> str:
        cfg, p = self.cfg, f"model.layers.{i}.self_attn."
        qkv = self.linear(h, [p + "q_proj", p + "k_proj", p + "v_proj"], f"layers.{i}.qkv")
        nq, nkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        if cfg.qk_norm:
            q, k, v = self.g.op("Split", [qkv, self.g.const([nq, nkv, nkv])], outputs=3, axis=-1)
            q = self.head_norm(q, cfg.num_heads, p + "q_norm.weight")
            k = self.head_norm(k, cfg.num_kv_heads, p + "k_norm.weight")
        else:
            q, k, v = qkv, "", ""  # packed QKV form of GroupQueryAttention
        cos, sin = self.rope_cache(i)
        bias = "sliding_attention_bias" if cfg.is_sliding(i) else "attention_bias"
        ins = [q, k, v, io["past_key"][i], io["past_value"][i], seqlens_k, total_len, cos, sin, "position_ids", bias]
        out = self.g.op(
            "GroupQueryAttention", ins,
            outputs=[f"layers.{i}.attn", io["present_key"][i], io["present_value"][i]],
            domain=MS_DOMAIN, num_heads=cfg.num_heads, kv_num_heads=cfg.num_kv_heads,
            do_rotary=1, rotary_interleaved=0, scale=float(cfg.scale),
            local_window_size=-1,  # sliding windows arrive through sliding_attention_bias
        )[0]
        return self.linear(out, [p + "o_proj"], f"layers.{i}.o_proj")

    def mlp(self, i: int, h: str) -> str:
        p = f"model.layers.{i}.mlp."
        gate_up = self.linear(h, [p + "gate_proj", p + "up_proj"], f"layers.{i}.gate_up")
        size = self.cfg.intermediate_size
        gate, up = self.g.op("Split", [gate_up, self.g.const([size, size])], outputs=2, axis=-1)
        if self.cfg.hidden_act == "silu":
            act = self.g.op("Mul", [gate, self.g.op("Sigmoid", [gate])])
        else:
            act = self.g.op("FastGelu", [gate], domain=MS_DOMAIN)
        return self.linear(self.g.op("Mul", [act, up]), [p + "down_proj"], f"layers.{i}.down_proj")

    # -- whole graph ---------------------------------------------------------------------------
    def kv_shape(self) -> list:
        return ["batch_size", self.cfg.num_kv_heads, "max_context", self.cfg.head_dim]

    def add_step_inputs(self) -> None:
        """The inputs every decoding graph takes: token ids, their positions, the mask and the additive bias."""
        g = self.g
        g.add_input("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        g.add_input("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        g.add_input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
        g.add_input("attention_bias", self.elem, ["batch_size", 1, "sequence_length", "total_sequence_length"])

    def attention_lengths(self) -> tuple[str, str]:
        """GroupQueryAttention's seqlens_k (valid tokens - 1 per row) and total length (attention_mask's width)."""
        g = self.g
        lengths = g.op("ReduceSum", ["attention_mask", g.const([1])], keepdims=0)
        seqlens_k = g.op("Cast", [g.op("Sub", [lengths, g.const(1)])], to=TensorProto.INT32)
        width = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const(1)], axis=0)
        return seqlens_k, g.op("Cast", [width], to=TensorProto.INT32)

    def build(self) -> onnx.ModelProto:
        cfg, g = self.cfg, self.g
        io = io_names(cfg)
        kv_shape = self.kv_shape()
        self.add_step_inputs()
        if cfg.active_sliding_window:
            g.add_input("sliding_attention_bias", self.elem, ["batch_size", 1, "sequence_length", "total_sequence_length"])
        for i in range(cfg.num_layers):
            g.add_input(io["past_key"][i], self.elem, kv_shape)
            g.add_input(io["past_value"][i], self.elem, kv_shape)
        seqlens_k, total_len = self.attention_lengths()

        embed = self.w["model.embed_tokens.weight"]
        embed_name = g.weight("model.embed_tokens.weight", embed.astype(self.dtype))
        x = g.op("Gather", [embed_name, "input_ids"], axis=0)
        if cfg.embed_scale != 1.0:
            x = g.op("Mul", [x, g.const(cfg.embed_scale, dtype=self.dtype)])

        pending, taps, tap_next = None, [], False
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            h, x = self.norm_with_skip(pending, x, p + "input_layernorm.weight")
            if tap_next:
                taps.append(x)
            attn = self.attention(i, h, io, seqlens_k, total_len)
            if cfg.family == "gemma3":
                attn = self.norm(attn, p + "post_attention_layernorm.weight")
                h, x = self.norm_with_skip(attn, x, p + "pre_feedforward_layernorm.weight")
                pending = self.norm(self.mlp(i, h), p + "post_feedforward_layernorm.weight")
            else:
                h, x = self.norm_with_skip(attn, x, p + "post_attention_layernorm.weight")
                pending = self.mlp(i, h)
            tap_next = i in self.opts.hidden_layers
        final, x = self.norm_with_skip(pending, x, "model.norm.weight")
        if tap_next:
            taps.append(x)

        logits = self.lm_head(final, embed_name)
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
        g.op("Identity", [logits], outputs=["logits"])
        g.add_output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", cfg.vocab_size])
        for i in range(cfg.num_layers):
            g.add_output(io["present_key"][i], self.elem, kv_shape)
            g.add_output(io["present_value"][i], self.elem, kv_shape)
        if taps:
            g.op("Concat", taps, outputs=["hidden_states"], axis=-1)
            width = len(taps) * cfg.hidden_size
            g.add_output("hidden_states", self.elem, ["batch_size", "sequence_length", width])
        return g.model()

    def lm_head(self, x: str, embed_name: str) -> str:
        cfg, g = self.cfg, self.g
        if "lm_head.weight" not in self.w:  # tied
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        if self.opts.precision == "int4" or not cfg.tie_word_embeddings:
            return self.linear(x, ["lm_head"], "lm_head")
        # Tied fp32/fp16: reuse the embedding table through Gemm(transB=1) instead of a transposed copy.
        flat = g.op("Reshape", [x, g.const([-1, cfg.hidden_size])])
        y = g.op("Gemm", [flat, embed_name], transB=1, name="lm_head")
        out_shape = g.op("Concat", [g.op("Shape", ["input_ids"]), g.const([cfg.vocab_size])], axis=0)
        return g.op("Reshape", [y, out_shape])


def build_target_graph(cfg: ModelConfig, weights: dict[str, np.ndarray], opts: GraphOptions,
                       quantized: dict[str, Int4Weight] | None = None) -> onnx.ModelProto:
    """weights: HF-named float arrays (model.layers.{i}.self_attn.q_proj.weight, ...).
    quantized: int4 weights already computed by quantize_model (else quantized here)."""
    return _TargetBuilder(cfg, dict(weights), opts, quantized).build()


def quantize_model(cfg: ModelConfig, weights: dict[str, np.ndarray], block_size: int = 32) -> dict[str, Int4Weight]:
    """Int4 weights of every projection and the lm_head (the tied embedding when there is none)."""
    from specrt.convert.quantize import is_projection

    out = {n: quantize_int4(np.asarray(w, dtype=np.float32), block_size) for n, w in weights.items() if is_projection(n)}
    if "lm_head.weight" not in out:
        out["lm_head.weight"] = quantize_int4(np.asarray(weights["model.embed_tokens.weight"], dtype=np.float32), block_size)
    return out
