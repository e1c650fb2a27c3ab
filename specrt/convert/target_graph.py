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
GroupQueryAttention with rotary inside (explicit position_ids, so tree tokens get their depth; target graphs
also take attention_min_rows [1] int64, convert/attention_rows.py; MoE graphs experts_token_by_token [1] int64,
convert/moe_graph.py) and a past/present buffer that the runtime binds to one OrtValue (the cache is written in
place, never copied), one fused gate/up MatMul. int4 and int8 turn every projection and the lm_head into
MatMulNBits (4 or 8 bits a weight), and the embedding table into a GatherBlockQuantized over the same blocks (where
the width is a whole number of blocks); a tied lm_head reads that same table. gguf does the same with a GGUF's own
blocks (convert/gguf_exact.py), each weight in its file's format, minus the block-sum correction of the formats with
a minimum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from specrt import archs
from specrt.bundle import EXPERT_CALLS_INPUT, PRECISIONS, SEQLENS_INPUT, TOTAL_LENGTH_INPUT, weight_bits
from specrt.convert.attention_rows import AttentionRows, pad_attention_rows
from specrt.convert.exact_attention import exact_attention_switch, needs_exact_attention
from specrt.convert.gemma4_graph import per_layer_inputs
from specrt.convert.gguf_exact import exact_from_ref
from specrt.convert.gpu_profile import activation_dtype
from specrt.convert.linear_attention_graph import add_state_io, add_state_outputs, linear_attention, state_layout
from specrt.convert.moe_graph import sparse_moe
from specrt.convert.onnx_graph import MS_DOMAIN, ExternalData, GraphWriter
from specrt.convert.quant_rows import QuantRows, WrittenGraph
from specrt.convert.short_conv_graph import short_conv
from specrt.convert.quantize import (ROW_CHUNK, QuantWeight, concat_rows, is_projection, quantize_blocks,
                                     same_form)
from specrt.models.config import ModelConfig
from specrt.models.tensor_source import WeightSource, rows_of, shape_of

EMBED = "model.embed_tokens.weight"
QUANTIZE_READ_BYTES = 256 << 20  # a weight larger than this as float32 is read and quantized in chunks of rows


@dataclass(frozen=True)
class GraphOptions:
    precision: str = "fp32"
    max_context: int = 2048
    hidden_layers: tuple[int, ...] = ()  # residual stream after these layers -> hidden_states
    int4_block_size: int = 32  # weights per quantization block (int4 and int8)
    int4_accuracy_level: int = 4  # int8 activations in MatMulNBits (fast on AVX2/AVX512 CPUs)
    # the attention_min_rows input: at 2 every GroupQueryAttention runs at least two rows, so that one-token calls
    # round as multi-token ones do (convert/attention_rows.py; the KV cache needs one slot past max_context)
    attention_rows_input: bool = False
    # with attention_rows_input: at attention_min_rows > 1 each attention is computed call-invariantly as well
    # (convert/exact_attention.py: an If per layer; CPU graphs only, where MLAS's GEMM blocking needs it)
    exact_attention: bool = False
    # where the graph will run: "cpu", or a GPU ("cuda", "rocm"), whose graphs compute in float16 at every precision
    # but fp32 (the GPU kernels of GroupQueryAttention, MatMulNBits' fast path and QMoE take float16 only), leave the
    # CPU's exactness machinery out (attention_rows_input, exact_attention, the experts' Scan) and let MatMulNBits
    # keep its activations (accuracy_level 0): convert/gpu_profile.py
    device: str = "cpu"
    # --precision gguf on the CPU: Q5_0/Q5_1/Q4_K/Q5_K/Q6_K weights multiplied by as the file's own blocks, in
    # specrt's operators (kernels/ggml_ops), instead of MatMulNBits forms of the same values that read 1.4-1.7x the bytes
    ggml_operators: bool = False

    @property
    def bits(self) -> int:
        """Bits per quantized weight; 0 for a float graph."""
        return weight_bits(self.precision)

    @property
    def activation_dtype(self) -> type:
        """numpy dtype of the graph's activations, KV cache and float weights."""
        return np.dtype(activation_dtype(self.precision, self.device)).type

    @property
    def accuracy_level(self) -> int:
        """MatMulNBits / QMoE accuracy_level: int8 activations on the CPU (4), none on a GPU (0)."""
        return self.int4_accuracy_level if self.device == "cpu" else 0


def io_names(cfg: ModelConfig, device: str = "cpu") -> dict:
    """Graph input/output names. past_key etc. name every layer's entry; only cfg.attention_layers have them in the
    graph (hybrids' linear layers carry states instead: convert/linear_attention_graph.py). A GPU graph takes no
    attention bias (chains only: causal masking with the past's offset, sliding layers by local_window_size), which
    keeps GroupQueryAttention on its fused kernels, and takes the total length as a scalar (no shape arithmetic that
    ONNX Runtime would move to the CPU). A rocm graph takes seqlens_k [B] int32 instead of attention_mask, whose width
    grows every step: MIGraphX compiles a program per input shape, and so sees only the call widths."""
    num_layers = cfg.num_layers
    sliding = ["sliding_attention_bias"] if cfg.active_sliding_window else []
    lengths = [SEQLENS_INPUT] if device == "rocm" else ["attention_mask"]
    extra = ["attention_bias"] + sliding if device == "cpu" else [TOTAL_LENGTH_INPUT]
    return {
        "inputs": ["input_ids", "position_ids"] + lengths + extra,
        "past_key": [f"past_key_values.{i}.key" for i in range(num_layers)],
        "past_value": [f"past_key_values.{i}.value" for i in range(num_layers)],
        "present_key": [f"present.{i}.key" for i in range(num_layers)],
        "present_value": [f"present.{i}.value" for i in range(num_layers)],
        "logits": "logits",
        "hidden_states": "hidden_states",
    }


class _TargetBuilder:
    def __init__(self, cfg: ModelConfig, weights: Mapping, opts: GraphOptions, quantized: dict | None):
        if opts.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.cfg, self.w, self.opts = cfg, weights, opts
        self.g = GraphWriter("specrt_target")
        if opts.device != "cpu" and (opts.attention_rows_input or opts.exact_attention):
            raise ValueError("attention_rows_input and exact_attention are CPU graphs' (convert/gpu_profile.py)")
        self.dtype = opts.activation_dtype
        self.elem = TensorProto.FLOAT16 if self.dtype == np.float16 else TensorProto.FLOAT
        self.rope_caches: dict = {}
        self.quantized: dict[str, QuantWeight] = quantized or {}  # computed beforehand (else each when used)
        self.quant_rows: dict[str, QuantRows] = {}  # HF weight name -> where its quantized rows went
        # a tied model's lm_head is its embedding table
        self.alias = {} if "lm_head.weight" in weights else {"lm_head.weight": "model.embed_tokens.weight"}
        self.attention_rows: AttentionRows | None = None  # padded attention inputs (attention_rows_input)
        self.expert_calls: str | None = None  # the graph input EXPERT_CALLS_INPUT, once expert_calls_input adds it
        self.exact_expert_calls = False
        self.gguf_requantized: dict[str, str] = {}  # --precision gguf: weight -> its GGUF type, where not exact
        self.block_sums_of: dict[tuple[str, int], str] = {}  # (activation, block) -> its block sums (minimums)
        self.layer_kv: dict[int, tuple[str, str]] = {}  # Gemma 4: a layer's new keys and values, for later readers

    def tensor(self, name: str) -> np.ndarray:
        """One source weight (read now: the builder keeps none)."""
        return self.w[self.alias.get(name, name)]

    def has(self, name: str) -> bool:
        return self.alias.get(name, name) in self.w

    def quantize(self, name: str) -> QuantWeight:
        if name in self.quantized:
            return self.quantized[name]
        if self.alias.get(name) in self.quantized:  # a tied lm_head: the embedding's quantized rows
            return self.quantized[self.alias[name]]
        bits, block = self.opts.bits, self.opts.int4_block_size
        if self.opts.precision == "gguf":
            ref = self.gguf_ref(self.alias.get(name, name))
            exact = exact_from_ref(ref) if ref is not None else None
            if exact is not None:
                return exact
            if ref is not None:  # a GGUF type with no exact form: the nearest, 8 bits in blocks of 32, said so
                bits, block = 8, 32
                self.gguf_requantized[name] = ref.gguf_type
        reader = self._row_reader(self.alias.get(name, name))
        if reader is not None and len(reader[0]) == 2 and 4 * reader[0][0] * reader[0][1] > QUANTIZE_READ_BYTES:
            # a large table (a 248k-token embedding or lm_head: 4 GB as float32) is read and quantized a chunk of
            # rows at a time; blocks lie within rows, so the bytes are those of quantizing it whole
            (rows, cols), read = reader
            step = max(ROW_CHUNK, QUANTIZE_READ_BYTES // (4 * cols) // ROW_CHUNK * ROW_CHUNK)
            return concat_rows([quantize_blocks(np.asarray(read(lo, min(lo + step, rows)), dtype=np.float32),
                                                block, bits=bits)
                                for lo in range(0, rows, step)])
        # asarray, not astype: a float32 tensor is not copied
        weight = np.asarray(self.tensor(name), dtype=np.float32)
        return quantize_blocks(weight, block, bits=bits)

    def expert_calls_input(self) -> str | None:
        """The graph input EXPERT_CALLS_INPUT (added on the first call), where the graph has exact calls through
        experts whose op rounds a token by its call (QMoE: convert/moe_graph.py); None without exact calls."""
        if self.exact_expert_calls and self.expert_calls is None:
            self.expert_calls = self.g.add_input(EXPERT_CALLS_INPUT, TensorProto.INT64, [1])
        return self.expert_calls

    def gguf_ref(self, key: str):
        """The GGUF tensor behind a weight (models.tensor_source.TensorRef), or None (another source)."""
        ref = getattr(self.w, "ref", None)
        try:
            found = ref(key) if ref is not None else None
        except KeyError:
            return None
        return found if found is not None and found.gguf_type else None

    def _row_reader(self, key: str):
        """(shape, read(lo, hi) -> rows lo..hi - 1) where the weights give a matrix's rows without reading all of it
        (a WeightSource, or a models.mtp.SourceTensor left in the source); else None."""
        w = self.w
        if isinstance(w, WeightSource):
            return tuple(shape_of(w, key)), lambda lo, hi: rows_of(w, key, np.arange(lo, hi))
        raw = dict.get(w, key) if isinstance(w, dict) else None
        if raw is not None and hasattr(raw, "read") and hasattr(raw, "shape"):
            return tuple(raw.shape), lambda lo, hi: raw[np.arange(lo, hi)]
        return None

    # -- weights -------------------------------------------------------------------------------
    def param(self, name: str, offset: float = 0.0) -> str:
        return self.g.weight(name, (self.tensor(name).astype(np.float32) + offset).astype(self.dtype))

    def linear(self, x: str, names: list[str], out_name: str) -> str:
        """y = x @ concat(W_names).T (+ bias), W in HF layout [out, in]; fused when several names."""
        biases = [self.tensor(n + ".bias") if self.has(n + ".bias") else None for n in names]
        bias = np.concatenate(biases).astype(self.dtype) if all(b is not None for b in biases) else None
        if self.opts.bits:
            parts = [self.quantize(n + ".weight") for n in names]
            if not same_form(parts):  # a GGUF may keep q, k and v in different formats: a matmul each, joined
                outs = [self.matmul_nbits(x, [n], [part], f"{out_name}.{j}", None if bias is None else b)
                        for j, (n, part, b) in enumerate(zip(names, parts, biases))]
                return self.g.op("Concat", outs, axis=-1)
            return self.matmul_nbits(x, names, parts, out_name, bias)
        w = np.concatenate([self.tensor(n + ".weight") for n in names], axis=0).astype(np.float32, copy=False)
        y = self.g.op("MatMul", [x, self.g.weight(out_name + ".weight_t", w.T.astype(self.dtype))], name=out_name)
        if bias is not None:
            y = self.g.op("Add", [y, self.g.weight(out_name + ".bias", bias)])
        return y

    def matmul_nbits(self, x: str, names: list[str], parts: list[QuantWeight], out_name: str, bias) -> str:
        """x @ concat(parts).T (+ bias) in one MatMulNBits; where the weights have per-block minimums (GGUF
        formats), minus the block sums of x times the minimums (y = x @ (s * q)^T - blocksums(x) @ M^T)."""
        q = concat_rows(parts)
        if self.opts.ggml_operators and q.ggml_type:
            return self.matmul_ggml(x, names, parts, q, out_name, bias)
        ins = [
            x,
            self.g.weight(out_name + ".qweight", q.packed),
            self.g.weight(out_name + ".scales", q.scales.astype(self.dtype)),
            self.g.weight(out_name + ".zero_points", q.zero_points),
            "",
            self.g.weight(out_name + ".bias", bias.astype(self.dtype)) if bias is not None else "",
        ]
        mins_t = ""
        if q.mins is not None:  # [n_blocks, N]: a row per block of x
            mins_t = self.g.weight(out_name + ".mins_t", q.mins.reshape(q.n, -1).T.astype(self.dtype))
        row = 0
        for n, part in zip(names, parts):
            self.quant_rows[n + ".weight"] = QuantRows(*ins[1:4], row, row + part.n, q.n, q.k, q.block_size, q.bits,
                                                       mins=mins_t)
            row += part.n
        later_bias = ""
        if self.opts.device == "rocm" and ins[5]:  # MIGraphX drops a MatMulNBits bias (and its zero points with it)
            ins, later_bias = ins[:5] + [""], ins[5]
        while ins[-1] == "":  # optional inputs left out at the end (MIGraphX reads zero points with 4 inputs only)
            ins = ins[:-1]
        y = self.g.op(
            "MatMulNBits", ins, domain=MS_DOMAIN, name=out_name, K=q.k, N=q.n, bits=q.bits,
            block_size=q.block_size, accuracy_level=self.opts.accuracy_level,
        )
        y = self.minus_minimums(x, y, mins_t, q.block_size) if mins_t else y
        return self.g.op("Add", [y, later_bias]) if later_bias else y

    def matmul_ggml(self, x: str, names: list[str], parts: list[QuantWeight], q: QuantWeight, out_name: str,
                    bias) -> str:
        """x @ concat(parts).T (+ bias) in specrt's operator for the GGUF type, over the file's own blocks."""
        from specrt.kernels import ggml_ops
        from specrt.kernels.ggml_ops.layout import interleave

        # the file's blocks, rows interleaved by 8: uint8 [ceil(N / 8), K / block * block bytes * 8]
        blocks = self.g.weight(out_name + ".ggml", interleave(q.ggml_type, q.ggml_blocks))
        columns = ""
        if q.ggml_columns is not None:  # the loader moved whole columns: x gathered into the file's column order
            # [K]: the HF column of each of the file's columns
            columns = self.g.weight(out_name + ".file_order", np.argsort(q.ggml_columns).astype(np.int64))
            x = self.g.op("Gather", [x, columns], axis=-1)
        row = 0
        for n, part in zip(names, parts):
            self.quant_rows[n + ".weight"] = QuantRows(blocks, "", "", row, row + part.n, q.n, q.k, q.block_size,
                                                       q.bits, ggml_type=q.ggml_type, columns=columns)
            row += part.n
        y = self.g.op(ggml_ops.OPS[q.ggml_type], [x, blocks], domain=ggml_ops.DOMAIN, name=out_name, N=q.n,
                      accuracy_level=self.opts.accuracy_level)
        return self.g.op("Add", [y, self.g.weight(out_name + ".bias", bias.astype(self.dtype))]) if bias is not None else y

    def minus_minimums(self, x: str, y: str, mins_t: str, block: int) -> str:
        """y - blocksums(x) @ mins_t: a MatMulNBits' output less its weights' per-block minimums ([n_blocks, N])."""
        return self.g.op("Sub", [y, self.g.op("MatMul", [self.block_sums(x, block), mins_t])])

    def block_sums(self, x: str, block: int) -> str:
        """x [B, S, K] -> the sums of its blocks of `block` features [B, S, K / block] (computed once per x)."""
        key = (x, block)
        if key not in self.block_sums_of:
            blocks = self.g.op("Reshape", [x, self.g.const([0, 0, -1, block])])  # [B, S, K / block, block]
            self.block_sums_of[key] = self.g.op("ReduceSum", [blocks, self.g.const([-1])], keepdims=0)
        return self.block_sums_of[key]

    def embed_lookup(self, name: str = EMBED, width: int = 0) -> tuple[str, str | None]:
        """Token embeddings of input_ids [B, S, width] (the table `name`, H wide unless said) and the float table's
        initializer (None when there is none). int4 and int8 keep the table quantized too (GatherBlockQuantized over
        the same blocks as MatMulNBits: about a sixth or a third of the float32 table) where the width is a whole
        number of blocks; otherwise it is float. A GGUF table of a type specrt's operators take keeps the file's own
        blocks (gather_ggml)."""
        g, q = self.g, None
        if self.opts.ggml_operators and self.opts.precision == "gguf":
            q = self.quantize(name)
            if q.ggml_type:  # the file's own blocks, looked up by specrt's operator (and a tied lm_head's)
                return self.gather_ggml(name, q), None
        # MIGraphX has no GatherBlockQuantized: a rocm graph looks tokens up in a float table
        if self.opts.bits and (width or self.cfg.hidden_size) % self.opts.int4_block_size == 0 \
                and self.opts.device != "rocm":
            q = q if q is not None else self.quantize(name)
            if name == EMBED and "lm_head.weight" in self.alias:  # tied: the lm_head quantizes the very same table
                self.quantized = {**self.quantized, name: q}
            data = g.weight(name + ".qweight", q.packed.reshape(q.n, -1))  # [V, H * bits / 8]
            scales = g.weight(name + ".scales", q.scales.reshape(q.n, -1).astype(self.dtype))  # [V, H / block]
            zero_points = g.weight(name + ".zero_points", q.zero_points.reshape(q.n, -1))
            mins = g.weight(name + ".mins", q.mins.reshape(q.n, -1).astype(self.dtype)) if q.mins is not None else ""
            self.quant_rows[name] = QuantRows(data, scales, zero_points, 0, q.n, q.n, q.k, q.block_size, q.bits,
                                              mins=mins, mins_by_row=True)
            block = q.block_size
            del q
            out = g.op("GatherBlockQuantized", [data, "input_ids", scales, zero_points], domain=MS_DOMAIN,
                       gather_axis=0, quantize_axis=1, block_size=block, bits=self.quant_rows[name].bits)
            if mins:  # GGUF formats with minimums: each block of a row minus its minimum
                per_block = g.op("Unsqueeze", [g.op("Gather", [mins, "input_ids"], axis=0), g.const([-1])])
                blocks = g.op("Reshape", [out, g.const([0, 0, -1, block])])  # [B, S, H / block, block]
                out = g.op("Reshape", [g.op("Sub", [blocks, per_block]), g.const([0, 0, -1])])
            return out, None
        table = g.weight(name, self.tensor(name).astype(self.dtype, copy=False))
        return g.op("Gather", [table, "input_ids"], axis=0), table

    def gather_ggml(self, name: str, q: QuantWeight) -> str:
        """Rows input_ids of the table `name` [B, S, K], from the GGUF file's own blocks (interleaved by 8, as
        matmul_ggml keeps them): a tied lm_head multiplies by the same initializer (tied_quantized_lm_head)."""
        from specrt.kernels import ggml_ops
        from specrt.kernels.ggml_ops.layout import interleave

        if name == EMBED and "lm_head.weight" in self.alias:  # tied: the lm_head is the very same table
            self.quantized = {**self.quantized, name: q}
        blocks = self.g.weight(name + ".ggml", interleave(q.ggml_type, q.ggml_blocks))  # [ceil(V / 8), bytes * 8]
        self.quant_rows[name] = QuantRows(blocks, "", "", 0, q.n, q.n, q.k, q.block_size, q.bits,
                                          ggml_type=q.ggml_type)
        return self.g.op(ggml_ops.GATHERS[q.ggml_type], ["input_ids", blocks], domain=ggml_ops.DOMAIN, N=q.n)

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

    def head_norm(self, x: str, heads: int, weight: str | None, d: int = 0) -> str:
        """RMSNorm over head_dim: [B, S, heads * D] -> same shape. weight None: no weight (Gemma 4's values)."""
        d = d or self.cfg.head_dim
        x4 = self.g.op("Reshape", [x, self.g.const([0, 0, heads, d])])
        if weight is None:
            ones = self.g.weight(f"ones_{d}", np.ones(d, dtype=self.dtype))
            y = self.g.op("SimplifiedLayerNormalization", [x4, ones], axis=-1, epsilon=self.cfg.rms_norm_eps,
                          stash_type=1)
        else:
            y = self.norm(x4, weight)
        return self.g.op("Reshape", [y, self.g.const([0, 0, heads * d])])

    def rope_cache(self, layer: int) -> tuple[str, str]:
        rope, dim = self.cfg.rope_for(layer), self.cfg.rotary_dim_of(layer)
        if (rope, dim) not in self.rope_caches:
            # partial rotary: GroupQueryAttention turns the first 2 * cos_cache.shape[1] channels of each head
            inv = np.array(rope.inv_freq(dim), dtype=np.float64)
            limit = max(self.opts.max_context, 1)
            angles = np.arange(limit, dtype=np.float64)[:, None] * inv[None]  # [M, D/2]
            scale = rope.attention_factor  # yarn scales cos and sin alike (1 otherwise)
            self.rope_caches[(rope, dim)] = (
                self.g.weight("cos_cache", (np.cos(angles) * scale).astype(self.dtype)),
                self.g.weight("sin_cache", (np.sin(angles) * scale).astype(self.dtype)),
            )
        return self.rope_caches[(rope, dim)]

    def fused_qkv(self, i: int, h: str) -> tuple[str, str, str, str | None]:
        """q, k, v (k = v = "": the packed QKV form of GroupQueryAttention) and the output gate (Qwen3.5), or None."""
        cfg, p = self.cfg, f"model.layers.{i}.self_attn."
        qkv = self.linear(h, [p + "q_proj", p + "k_proj", p + "v_proj"], f"layers.{i}.qkv")
        nq, nkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        if cfg.attn_output_gate:  # q_proj: per head its query, then its gate
            q2, k, v = self.g.op("Split", [qkv, self.g.const([2 * nq, nkv, nkv])], outputs=3, axis=-1)
            q2 = self.g.op("Reshape", [q2, self.g.const([0, 0, cfg.num_heads, 2 * cfg.head_dim])])
            q, gate = self.g.op("Split", [q2, self.g.const([cfg.head_dim, cfg.head_dim])], outputs=2, axis=-1)
            q = self.g.op("Reshape", [q, self.g.const([0, 0, nq])])
            gate = self.g.op("Reshape", [gate, self.g.const([0, 0, nq])])  # [B, S, N * D]
            q = self.head_norm(q, cfg.num_heads, p + "q_norm.weight")
            k = self.head_norm(k, cfg.num_kv_heads, p + "k_norm.weight")
            return q, k, v, gate
        if cfg.qk_norm:
            q, k, v = self.g.op("Split", [qkv, self.g.const([nq, nkv, nkv])], outputs=3, axis=-1)
            q = self.head_norm(q, cfg.num_heads, p + "q_norm.weight")
            k = self.head_norm(k, cfg.num_kv_heads, p + "k_norm.weight")
            return q, k, v, None
        return qkv, "", "", None

    def attention(self, i: int, h: str, io: dict, seqlens_k: str, total_len: str) -> str:
        """The layer's attention. A layer that reads another's cache (Gemma 4's last layers) runs GroupQueryAttention
        over that layer's past with that layer's new keys and values (it writes what the source wrote: the same
        values to the same slots), into a present of its own that nothing reads."""
        cfg, p = self.cfg, f"model.layers.{i}.self_attn."
        own_qkv = archs.of(cfg).hook("graph_qkv")  # an architecture with a q, k, v of its own (Gemma 4)
        q, k, v, gate = own_qkv(self, i, h) if own_qkv else self.fused_qkv(i, h)
        source = cfg.kv_source(i)
        cos, sin = self.rope_cache(i)
        bias = "sliding_attention_bias" if cfg.is_sliding(i) else "attention_bias"
        window = -1  # sliding windows arrive through sliding_attention_bias, except in GPU graphs (no bias)
        if self.opts.device != "cpu":
            # local_window_size W: the query's own key and the W - 1 before it, as HF's window of W (the tiny Gemma 4s
            # validate against torch on the CPU kernel)
            bias, window = "", cfg.active_sliding_window if cfg.is_sliding(i) else -1
        positions, rows, name = "position_ids", self.attention_rows, f"layers.{i}.attn"
        rotary = 1
        if self.opts.device == "rocm":  # MIGraphX's GroupQueryAttention ignores position_ids: keys and queries turn here
            q, k, v = self.rotate_outside(i, q, k, v, positions, cos, sin, source == i)
            cos = sin = positions = ""
            rotary = 0
        if rows is not None:  # at least two rows: seqlens_k and total_len are the padded ones already
            q, k, v = rows.pad(self.g, q), rows.pad(self.g, k), rows.pad(self.g, v)
            positions, bias, name = rows.position_ids, rows.biases[bias], f"layers.{i}.attn_rows"
        if source == i:
            self.layer_kv[i] = (k, v)
            present = [io["present_key"][i], io["present_value"][i]]
        else:
            k, v = self.layer_kv[source]
            present = [f"layers.{i}.unread_present_key", f"layers.{i}.unread_present_value"]
        ins = [q, k, v, io["past_key"][source], io["past_value"][source], seqlens_k, total_len, cos, sin, positions,
               bias]
        sinks = None
        if cfg.attention_sinks:  # head_sink [N]: each head's logit that joins the softmax's denominator
            sinks = self.param(p + "sinks")
            ins.append(sinks)
        while ins[-1] == "":  # optional inputs left out at the end (MIGraphX parses 7 to 11 inputs)
            ins.pop()
        out = self.g.op(
            "GroupQueryAttention", ins, outputs=[name, *present],
            domain=MS_DOMAIN, num_heads=cfg.num_heads, kv_num_heads=cfg.kv_heads_of(i),
            do_rotary=rotary, rotary_interleaved=0, scale=float(cfg.scale_of(i)),
            local_window_size=window,
        )[0]
        if rows is not None:
            if self.opts.exact_attention and needs_exact_attention(cfg.head_dim_of(i)):  # convert/exact_attention.py
                out = exact_attention_switch(self, rows.exact, out, q, present, positions, bias, total_len, i, sinks)
            out = rows.cut(self.g, out, f"layers.{i}.attn")
        if gate is not None:
            out = self.g.op("Mul", [out, self.g.op("Sigmoid", [gate])])
        return self.linear(out, [p + "o_proj"], f"layers.{i}.o_proj")

    def rotate_outside(self, i: int, q: str, k: str, v: str, positions: str, cos: str, sin: str,
                       own_keys: bool) -> tuple[str, str, str]:
        """q (and, where the layer writes its own cache, k) [B, S, heads * D] turned by RotaryEmbedding at
        `positions`, for an attention that does not turn them itself; the packed q|k|v form is split first."""
        cfg, g = self.cfg, self.g
        n, kv, d = cfg.num_heads, cfg.kv_heads_of(i), cfg.head_dim_of(i)
        if own_keys and k == "":  # the packed form
            q, k, v = g.op("Split", [q, g.const([n * d, kv * d, kv * d])], outputs=3, axis=-1)
        dim = 2 * len(cfg.rope_for(i).inv_freq(cfg.rotary_dim_of(i)))  # the turned channels of each head

        def turn(x, heads):
            return g.op("RotaryEmbedding", [x, positions, cos, sin], domain=MS_DOMAIN, interleaved=0,
                        num_heads=heads, rotary_embedding_dim=dim)

        return turn(q, n), turn(k, kv) if own_keys else k, v

    def mlp(self, i: int, h: str) -> str:
        if self.cfg.is_moe(i) and not self.cfg.moe_with_dense:
            return sparse_moe(self, i, h)
        return self.dense_mlp(h, f"model.layers.{i}.mlp.", self.cfg.intermediate_of(i), f"layers.{i}")

    def dense_mlp(self, h: str, p: str, size: int, name: str) -> str:
        """down(act(gate(h)) * up(h)) for the projections named p + gate_proj etc. of width `size`."""
        gate_up = self.linear(h, [p + "gate_proj", p + "up_proj"], f"{name}.gate_up")
        gate, up = self.g.op("Split", [gate_up, self.g.const([size, size])], outputs=2, axis=-1)
        if self.cfg.hidden_act == "silu":
            act = self.g.op("Mul", [gate, self.g.op("Sigmoid", [gate])])
        else:
            act = self.g.op("FastGelu", [gate], domain=MS_DOMAIN)
        return self.linear(self.g.op("Mul", [act, up]), [p + "down_proj"], f"{name}.down_proj")

    # -- whole graph ---------------------------------------------------------------------------
    def kv_shape(self, layer: int | None = None) -> list:
        heads, dim = (self.cfg.num_kv_heads, self.cfg.head_dim) if layer is None else self.cfg.kv_shape_of(layer)
        return ["batch_size", heads, "max_context", dim]

    def add_step_inputs(self) -> None:
        """The inputs every decoding graph takes: token ids, their positions, the mask and the additive bias."""
        g = self.g
        g.add_input("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        g.add_input("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        if self.opts.device == "rocm":
            g.add_input(SEQLENS_INPUT, TensorProto.INT32, ["batch_size"])  # valid tokens - 1 per row
        else:
            g.add_input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
        if self.opts.device != "cpu":  # GroupQueryAttention reads it on the host: bound there by the runtime
            g.add_input(TOTAL_LENGTH_INPUT, TensorProto.INT32, [])
        if self.opts.device == "cpu":
            g.add_input("attention_bias", self.elem, ["batch_size", 1, "sequence_length", "total_sequence_length"])

    def attention_lengths(self) -> tuple[str, str]:
        """GroupQueryAttention's seqlens_k (valid tokens - 1 per row) and total length (attention_mask's width)."""
        g = self.g
        if self.opts.device == "rocm":
            return SEQLENS_INPUT, TOTAL_LENGTH_INPUT
        lengths = g.op("ReduceSum", ["attention_mask", g.const([1])], keepdims=0)
        seqlens_k = g.op("Cast", [g.op("Sub", [lengths, g.const(1)])], to=TensorProto.INT32)
        if self.opts.device != "cpu":  # the runtime's own scalar: a Shape here would put shape math on the CPU
            return seqlens_k, TOTAL_LENGTH_INPUT
        width = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const(1)], axis=0)
        return seqlens_k, g.op("Cast", [width], to=TensorProto.INT32)

    def build(self) -> onnx.ModelProto:
        cfg, g = self.cfg, self.g
        io = io_names(cfg)
        self.add_step_inputs()
        if cfg.active_sliding_window and self.opts.device == "cpu":
            g.add_input("sliding_attention_bias", self.elem, ["batch_size", 1, "sequence_length", "total_sequence_length"])
        for i in cfg.attention_layers:
            g.add_input(io["past_key"][i], self.elem, self.kv_shape(i))
            g.add_input(io["past_value"][i], self.elem, self.kv_shape(i))
        states = state_layout(cfg)
        if states is not None:
            add_state_io(self, states)
        seqlens_k, total_len = self.attention_lengths()
        if self.opts.attention_rows_input:
            biases = ["attention_bias"] + (["sliding_attention_bias"] if cfg.active_sliding_window else [])
            self.attention_rows = pad_attention_rows(g, seqlens_k, total_len, biases)
            seqlens_k, total_len = self.attention_rows.seqlens_k, self.attention_rows.total_len
            # exact calls through the experts (convert/moe_graph.py): the input is added where an op needs it
            self.exact_expert_calls = bool(cfg.moe_layers) and not cfg.moe_with_dense

        x, embed_name = self.embed_lookup()
        if cfg.embed_scale != 1.0:
            x = g.op("Mul", [x, g.const(cfg.embed_scale, dtype=self.dtype)])
        ple = per_layer_inputs(self, x) if cfg.ple_size else None
        layer_rest = archs.of(cfg).hook("graph_layer_rest")

        pending, taps, tap_next = None, [], False
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            h, x = self.norm_with_skip(pending, x, p + "input_layernorm.weight")
            if tap_next:
                taps.append(x)
            if cfg.is_linear(i):
                attn = linear_attention(self, i, h)
            elif cfg.is_short_conv(i):
                attn = short_conv(self, i, h)
            else:
                attn = self.attention(i, h, io, seqlens_k, total_len)
            if layer_rest is not None:  # an architecture's own layer after attention (Gemma 3, Gemma 4)
                x, pending = layer_rest(self, i, x, attn, ple)
            else:
                h, x = self.norm_with_skip(attn, x, p + "post_attention_layernorm.weight")
                pending = self.mlp(i, h)
            tap_next = i in self.opts.hidden_layers
        final, x = self.norm_with_skip(pending, x, "model.norm.weight")
        if tap_next:
            taps.append(x)

        logits = self.lm_head(final, embed_name)
        if cfg.final_softcap:  # cap * tanh(logits / cap)
            cap = g.const(cfg.final_softcap, dtype=self.dtype)
            logits = g.op("Mul", [g.op("Tanh", [g.op("Div", [logits, cap])]), cap])
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
        g.op("Identity", [logits], outputs=["logits"])
        g.add_output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", cfg.vocab_size])
        for i in cfg.attention_layers:
            g.add_output(io["present_key"][i], self.elem, self.kv_shape(i))
            g.add_output(io["present_value"][i], self.elem, self.kv_shape(i))
        if states is not None:
            add_state_outputs(self, states)
        if taps:
            g.op("Concat", taps, outputs=["hidden_states"], axis=-1)
            width = len(taps) * cfg.hidden_size
            g.add_output("hidden_states", self.elem, ["batch_size", "sequence_length", width])
        return g.model()

    def lm_head(self, x: str, embed_name: str | None) -> str:
        cfg, g = self.cfg, self.g
        if self.opts.bits and EMBED in self.quant_rows and self.lm_head_is_the_embedding():
            return self.tied_quantized_lm_head(x)
        if self.opts.bits or not cfg.tie_word_embeddings or embed_name is None:
            return self.linear(x, ["lm_head"], "lm_head")
        # Tied fp32/fp16: reuse the embedding table through Gemm(transB=1) instead of a transposed copy.
        flat = g.op("Reshape", [x, g.const([-1, cfg.hidden_size])])
        y = g.op("Gemm", [flat, embed_name], transB=1, name="lm_head")
        out_shape = g.op("Concat", [g.op("Shape", ["input_ids"]), g.const([cfg.vocab_size])], axis=0)
        return g.op("Reshape", [y, out_shape])

    def lm_head_is_the_embedding(self) -> bool:
        """Tied: the weights have no lm_head of their own (or were quantized with the embedding's table as it)."""
        if "lm_head.weight" in self.quantized:
            return self.quantized["lm_head.weight"] is self.quantized.get(EMBED)
        return "lm_head.weight" in self.alias

    def tied_quantized_lm_head(self, x: str) -> str:
        """A tied model's lm_head over the embedding's own quantized table (stored once: reshaped into MatMulNBits'
        layout, which ONNX Runtime folds when the session loads), minus its minimums where it has them."""
        g, r = self.g, self.quant_rows[EMBED]
        if r.ggml_type:  # the file's blocks the embedding gathers from (gather_ggml)
            from specrt.kernels import ggml_ops

            self.quant_rows["lm_head.weight"] = r
            return g.op(ggml_ops.OPS[r.ggml_type], [x, r.qweight], domain=ggml_ops.DOMAIN, name="lm_head", N=r.n,
                        accuracy_level=self.opts.accuracy_level)
        n_blocks = r.k // r.block_size
        qweight = g.op("Reshape", [r.qweight, g.const([r.n, n_blocks, r.block_size * r.bits // 8])])
        scales = g.op("Reshape", [r.scales, g.const([-1])])
        zero_points = g.op("Reshape", [r.zero_points, g.const([-1])])
        self.quant_rows["lm_head.weight"] = r
        y = g.op("MatMulNBits", [x, qweight, scales, zero_points], domain=MS_DOMAIN, name="lm_head", K=r.k, N=r.n,
                 bits=r.bits, block_size=r.block_size, accuracy_level=self.opts.accuracy_level)
        if not r.mins:
            return y
        return self.minus_minimums(x, y, g.op("Transpose", [r.mins], perm=[1, 0]), r.block_size)  # mins [V, n_blocks]


def build_target_graph(cfg: ModelConfig, weights: Mapping, opts: GraphOptions,
                       quantized: dict[str, QuantWeight] | None = None) -> onnx.ModelProto:
    """The whole graph in memory. weights: HF-named float arrays (model.layers.{i}.self_attn.q_proj.weight, ...).
    quantized: int4/int8 weights already computed by quantize_model (else quantized here)."""
    return _TargetBuilder(cfg, weights, opts, quantized).build()


def write_graph(builder: _TargetBuilder, folder: Path, stem: str) -> WrittenGraph:
    """Build a builder's graph streaming: each weight is read, converted (quantized for int4/int8) and appended to
    `<stem>.onnx.data` in turn, then `<stem>.onnx` is saved. No copy of the model is ever in memory; the files
    are byte for byte those of onnx.save_model on the same builder's in-memory model."""
    data = ExternalData(folder, f"{stem}.onnx.data")
    builder.g.external = data
    try:
        model = builder.build()
    finally:
        data.close()
    onnx.save_model(model, str(Path(folder) / f"{stem}.onnx"))
    return WrittenGraph(data, builder.quant_rows, builder.gguf_requantized, tuple(i.name for i in model.graph.input))


def write_target_graph(cfg: ModelConfig, weights: Mapping, opts: GraphOptions, folder: Path,
                       stem: str) -> WrittenGraph:
    """The target's graph, written streaming (write_graph)."""
    return write_graph(_TargetBuilder(cfg, weights, opts, None), folder, stem)


def quantize_model(cfg: ModelConfig, weights: Mapping, block_size: int = 32, bits: int = 4) -> dict[str, QuantWeight]:
    """Quantized weights of every projection, the lm_head (the tied embedding when there is none) and the embedding
    table (where its width is a whole number of blocks, as the graph keeps it), all in memory at once (for tests
    and small models; conversion quantizes each weight as the graph is written)."""
    def q(name: str) -> QuantWeight:
        return quantize_blocks(np.asarray(weights[name], dtype=np.float32), block_size, bits=bits)

    out = {n: q(n) for n in weights if is_projection(n)}
    if cfg.hidden_size % block_size == 0:
        out[EMBED] = q(EMBED)
    if "lm_head.weight" not in out:
        out["lm_head.weight"] = out.get(EMBED) or q(EMBED)
    return out
