"""The DFlash drafter as an ONNX graph (definition: models/dflash.py), built node by node with the target's
operators (int4/int8: MatMulNBits and a GatherBlockQuantized embedding table) and written streaming: each weight
is read, converted (quantized for int4/int8) and appended to the data file in turn, so building the graph of an 8B
model's drafter holds one weight, never the drafter.

Inputs: input_ids [1, S] (the anchor token and S - 1 mask tokens, embedded with the target's table carried in
the graph), features [1, C, F] (the target's hidden states at the drafter's layers for the C context positions
it has not read yet), position_ids [1, C + S] (those C positions, then the block's S), and per draft layer
past_key_values.{i}.key|value [1, KV, P, D] (the context read before). Outputs: logits [1, S - 1, V] for the
masked positions (through the target's lm_head, or [1, S - 1, V_draft] through its draft-vocabulary rows),
present.{i}.key|value [1, KV, P + C, D]: the past plus the new context, never the block, so a rejected draft
leaves nothing to undo, and, where the checkpoint has a confidence head (models/dflash_confidence.py), last
accept_logits [1, S - 1]. The cache is small (context keys of a few layers) and is carried between calls by the
drafter as arrays.

A GPU graph (GPU profile, convert/gpu_profile.py) computes in float16 (features and caches float16, logits and
accept_logits float32) and takes the context's and the block's lengths as host inputs context_length [1] and
block_length [1] int64 (specrt/dflash_io.py): the slices they bound then need no shape arithmetic, which ONNX
Runtime would keep on the CPU.

Per layer: queries from the normed block, keys and values from [context; block] (one fused K/V projection),
q/k norms, rotary through com.microsoft RotaryEmbedding, attention that is not causal (MatMul, Softmax,
MatMul over the past, the context and the block), the fused gate/up MLP. Weights are named as the target
graph's (model.layers.{i}.self_attn.q_proj.weight, ...; DFlashWeights maps the checkpoint's names to them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from specrt.convert.onnx_graph import MS_DOMAIN
from specrt.convert.quant_rows import WrittenGraph
from specrt.convert.target_graph import GraphOptions, _TargetBuilder, write_graph
from specrt.dflash_io import BLOCK_LENGTH, CONTEXT_LENGTH, call_feeds
from specrt.models.dflash import DFlashConfig
from specrt.models.tensor_source import WeightSource, rows_of, shape_of

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


class DFlashWeights(WeightSource):
    """The drafter's weights under the graph's names, read when asked: the checkpoint's tensors (layers.{i}.* as
    model.layers.{i}.*, norm.weight as model.norm.weight, fc and hidden_norm as they are), the target's
    embedding table and its lm_head (only the draft vocabulary's rows where the drafter has one), or the
    checkpoint's own lm_head where it brings one (an export for vLLM does)."""

    def __init__(self, checkpoint: Mapping, target: Mapping, target_head: str, head_rows: np.ndarray | None):
        self.checkpoint, self.target, self.target_head, self.head_rows = checkpoint, target, target_head, head_rows
        self.names = {EMBED: None, HEAD: None}
        self.own_head = HEAD in checkpoint
        for name in checkpoint:
            if name.startswith("layers."):
                self.names["model." + name] = name
            elif name == "norm.weight":
                self.names["model.norm.weight"] = name
            elif name not in ("d2t", HEAD):
                self.names[name] = name

    def __getitem__(self, name: str) -> np.ndarray:
        if name == EMBED:
            return self.target[EMBED]
        if name == HEAD and self.own_head:
            return self.checkpoint[HEAD]
        if name == HEAD:
            if self.head_rows is None:
                return self.target[self.target_head]
            return rows_of(self.target, self.target_head, self.head_rows)  # [V_draft, H]
        return self.checkpoint[self.names[name]]

    def shape(self, name: str) -> tuple[int, ...]:
        if name == EMBED:
            return shape_of(self.target, EMBED)
        if name == HEAD and self.own_head:
            return shape_of(self.checkpoint, HEAD)
        if name == HEAD:
            full = shape_of(self.target, self.target_head)
            return full if self.head_rows is None else (len(self.head_rows), full[1])
        return shape_of(self.checkpoint, self.names[name])

    def rows(self, name: str, ids) -> np.ndarray:
        if name == EMBED:
            return rows_of(self.target, EMBED, ids)
        if name == HEAD and self.own_head:
            return self.checkpoint[HEAD][np.asarray(ids)]
        if name == HEAD:
            ids = np.asarray(ids) if self.head_rows is None else self.head_rows[np.asarray(ids)]
            return rows_of(self.target, self.target_head, ids)
        return self[name][ids]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.names


class _DFlashBuilder(_TargetBuilder):
    def __init__(self, cfg: DFlashConfig, weights: Mapping, opts: GraphOptions, out_vocab: int,
                 confidence: dict | None = None):
        super().__init__(cfg.layers, weights, opts, None)
        self.dflash, self.out_vocab, self.confidence = cfg, out_vocab, confidence

    def build(self) -> onnx.ModelProto:
        cfg, g = self.cfg, self.g
        names_in, names_out = io_names(cfg.num_layers)
        kv = [1, cfg.num_kv_heads, "past", cfg.head_dim]
        g.add_input("input_ids", TensorProto.INT64, [1, "block"])
        g.add_input("features", self.elem, [1, "context", self.dflash.feature_width])
        g.add_input("position_ids", TensorProto.INT64, [1, "positions"])
        for name in names_in[3:]:
            g.add_input(name, self.elem, kv)
        if self.opts.device == "cpu":
            context = g.op("Slice", [g.op("Shape", ["features"]), g.const([1]), g.const([2])])  # [1]: C
            self.block_length = None
        else:  # host inputs: no shape arithmetic
            context = g.add_input(CONTEXT_LENGTH, TensorProto.INT64, [1])
            self.block_length = g.add_input(BLOCK_LENGTH, TensorProto.INT64, [1])
        block_pos = g.op("Slice", ["position_ids", context, g.const([np.iinfo(np.int64).max]), g.const([1])])
        x, _ = self.embed_lookup()  # [1, S, H]
        ctx = self.norm(self.linear("features", ["fc"], "fc"), "hidden_norm.weight")  # [1, C, H]

        pending = None
        for i in range(cfg.num_layers):
            h, x = self.norm_with_skip(pending, x, f"model.layers.{i}.input_layernorm.weight")
            attn = self._attention(i, h, ctx, context, block_pos, names_in, names_out)
            h, x = self.norm_with_skip(attn, x, f"model.layers.{i}.post_attention_layernorm.weight")
            pending = self.mlp(i, h)
        final, _ = self.norm_with_skip(pending, x, "model.norm.weight")  # [1, S, H]
        masked = g.op("Slice", [final, g.const([1]), g.const([np.iinfo(np.int64).max]), g.const([1])])
        logits = self.linear(masked, ["lm_head"], "lm_head")  # [1, S - 1, V_out]
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
        g.op("Identity", [logits], outputs=["logits"])
        g.add_output("logits", TensorProto.FLOAT, [1, "masked", self.out_vocab])
        for name in names_out[1:]:
            g.add_output(name, self.elem, [1, cfg.num_kv_heads, "total", cfg.head_dim])
        if self.confidence is not None:
            self._accept_logits(masked, logits)
        return g.model()

    def _accept_logits(self, masked: str, logits: str) -> None:
        """The confidence head (models/dflash_confidence.py accept_logits) on masked [1, S - 1, H] and logits
        [1, S - 1, V_out] -> output accept_logits [1, S - 1]."""
        g, head = self.g, self.confidence
        dot = g.op("MatMul", [masked, g.weight("confidence.weight", head["weight"].reshape(-1, 1).astype(self.dtype))])
        dot = g.op("Squeeze", [dot, g.const([-1])])  # [1, S - 1]
        if self.dtype != np.float32:  # the head's sum in float32, as its logits
            dot = g.op("Cast", [dot], to=TensorProto.FLOAT)
        if self.block_length is None:
            count = g.op("Slice", [g.op("Shape", [masked]), g.const([1]), g.const([2])])  # [1]: S - 1
            bias, scale = (g.op("Slice", [g.weight(f"confidence.{n}", head[n].astype(np.float32)), g.const([0]),
                                          count]) for n in ("bias", "prob_scale"))  # [S - 1] each
        else:  # entries 1..S-1 of [0, b_0, b_1, ...]: the first S - 1, bounded by a host input
            bias, scale = (g.op("Slice", [g.weight(f"confidence.{n}", np.concatenate([[0.0], head[n]])
                                                   .astype(np.float32)), g.const([1]), self.block_length])
                           for n in ("bias", "prob_scale"))
        top = g.op("Sub", [g.op("ReduceMax", [logits, g.const([-1])], keepdims=0),
                           g.op("ReduceLogSumExp", [logits, g.const([-1])], keepdims=0)])  # [1, S - 1]
        out = g.op("Add", [g.op("Add", [dot, bias]), g.op("Mul", [scale, top])])
        g.op("Identity", [out], outputs=["accept_logits"])
        g.add_output("accept_logits", TensorProto.FLOAT, [1, "masked"])

    def _attention(self, i: int, h: str, ctx: str, context: str, block_pos: str, names_in, names_out) -> str:
        """h [1, S, H] normed block; ctx [1, C, H]. Returns the o_proj output [1, S, H]; writes present.{i}.*."""
        cfg, g, p = self.cfg, self.g, f"model.layers.{i}.self_attn."
        d, heads, kv_heads = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        cos, sin = self.rope_cache(i)
        q = self.head_norm(self.linear(h, [p + "q_proj"], f"layers.{i}.q_proj"), heads, p + "q_norm.weight")
        q = g.op("RotaryEmbedding", [q, block_pos, cos, sin], domain=MS_DOMAIN, interleaved=0)  # [1, S, NH * D]
        both = g.op("Concat", [ctx, h], axis=1)  # [1, C + S, H]
        kvp = self.linear(both, [p + "k_proj", p + "v_proj"], f"layers.{i}.kv_proj")
        k, v = g.op("Split", [kvp, g.const([kv_heads * d, kv_heads * d])], outputs=2, axis=-1)
        k = self.head_norm(k, kv_heads, p + "k_norm.weight")
        k = g.op("RotaryEmbedding", [k, "position_ids", cos, sin], domain=MS_DOMAIN, interleaved=0)

        def heads_first(t: str, n: int) -> str:  # [1, T, n * D] -> [1, n, T, D]
            return g.op("Transpose", [g.op("Reshape", [t, g.const([0, 0, n, d])])], perm=[0, 2, 1, 3])

        k4, v4 = heads_first(k, kv_heads), heads_first(v, kv_heads)  # [1, KV, C + S, D]
        past_k, past_v = names_in[3 + 2 * i], names_in[4 + 2 * i]
        for past, new, present in ((past_k, k4, names_out[1 + 2 * i]), (past_v, v4, names_out[2 + 2 * i])):
            new_context = g.op("Slice", [new, g.const([0]), context, g.const([2])])  # [1, KV, C, D]
            g.op("Concat", [past, new_context], outputs=[present], axis=2)  # past + the new context
        keys = g.op("Concat", [past_k, k4], axis=2)  # [1, KV, P + C + S, D]
        values = g.op("Concat", [past_v, v4], axis=2)
        # queries grouped by KV head (head h = kv * G + g): [1, NH, S, D] -> [1, KV, G * S, D]
        qg = g.op("Reshape", [heads_first(q, heads), g.const([0, kv_heads, -1, d])])
        scores = g.op("MatMul", [qg, g.op("Transpose", [keys], perm=[0, 1, 3, 2])])
        scores = g.op("Mul", [scores, g.const(cfg.scale, dtype=self.dtype)])
        out = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), values])  # [1, KV, G * S, D]
        out = g.op("Transpose", [g.op("Reshape", [out, g.const([0, heads, -1, d])])], perm=[0, 2, 1, 3])
        out = g.op("Reshape", [out, g.const([0, 0, heads * d])])  # [1, S, NH * D]
        return self.linear(out, [p + "o_proj"], f"layers.{i}.o_proj")


def io_names(layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return ["input_ids", "features", "position_ids", *past], ["logits", *present]


def write_dflash_graph(cfg: DFlashConfig, weights: Mapping, opts: GraphOptions, out_vocab: int, folder: Path,
                       stem: str, confidence: dict | None = None) -> WrittenGraph:
    """Write `<stem>.onnx` and `<stem>.onnx.data`, one weight in memory at a time. weights: graph names
    (DFlashWeights); out_vocab: the lm_head's rows (the draft vocabulary's size where there is one);
    confidence: the confidence head's tensors (None: no accept_logits output)."""
    return write_graph(_DFlashBuilder(cfg, weights, opts, out_vocab, confidence), folder, stem)


def validation_calls(cfg: DFlashConfig, vocab: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Two calls (the second reads the first's cache): (input_ids [1, S], features [1, C, F], position_ids)."""
    rng = np.random.default_rng(seed)
    calls, start = [], 0
    for ctx in (5, 2):
        ids = np.concatenate([rng.integers(0, vocab, (1, 1)), np.full((1, cfg.block_size - 1), cfg.mask_token_id)], 1)
        feats = rng.normal(size=(1, ctx, cfg.feature_width)).astype(np.float32)
        calls.append((ids, feats, np.arange(start, start + ctx + cfg.block_size)[None]))
        start += ctx
    return calls


def reference_outputs(cfg: DFlashConfig, weights: Mapping, vocab: int, seed: int = 0, confidence: dict | None = None):
    """validation_calls and what the torch drafter, run layer by layer on these weights (models/dflash.py
    run_dflash_layerwise), returns for them (with the confidence head's accept_logits last where there is one):
    computed once, compared with any number of sessions."""
    from specrt.models.dflash import run_dflash_layerwise

    calls = validation_calls(cfg, vocab, seed)
    return calls, run_dflash_layerwise(cfg, weights, calls, confidence=confidence)


def max_difference(session, cfg: DFlashConfig, calls, reference) -> float:
    """Max |difference| of logits and caches between an ORT session over the graph and the reference outputs,
    over the calls in turn (each session call reads the caches the one before returned)."""
    c = cfg.layers
    past = [np.zeros((1, c.num_kv_heads, 0, c.head_dim), np.float32)] * (2 * c.num_layers)
    worst = 0.0
    for (ids, feats, pos), ref in zip(calls, reference):
        outs = session.run(None, call_feeds(session, ids, feats, pos, past))
        worst = max(worst, *(float(np.abs(a.astype(np.float32) - b).max()) for a, b in zip(outs, ref)))
        past = outs[1:1 + 2 * c.num_layers]
    return worst
