"""Gemma 4's assistant drafter (models/gemma4_assistant.py) as an ONNX graph that reads the target's KV cache.

inputs   input_ids [1, S] int64 (the token each row feeds), position_ids [1, S] int64 (every step of one draft at
         the position of the newest token, p), kv_length [1] int64 (p: the target's committed slots),
         features [1, S, B] (the target's residual stream after its last layer; the graph applies the target's
         final norm), hidden [1, S, B] (the previous step's hidden_out), use_features bool [1],
         past_key_values.{i}.key|value [1, KV, M + 1, D] for the two target layers it reads: the target's own cache
         buffers, bound read-only by the runtime (nothing is copied and nothing written)
outputs  logits [1, S, V], hidden_out [1, S, B]

Each layer's query (q_proj, q_norm, rotary at position_ids) attends over slots 0..p-1 of the target's last cached
full layer, or over the last sliding_window + 1 slots before p of its last cached sliding layer (the window
transformers' Gemma4AssistantForCausalLM gives its sliding layers: checked in tests/test_gemma4_assistant.py), with
plain MatMul / Softmax (the cache is only read). The rest of each layer is a Gemma 4 layer's
(convert/gemma4_graph.py). Built by the target builder, so int4 / int8 quantize its projections as the target's.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from specrt.convert.gemma4_graph import gemma4_layer_rest
from specrt.convert.target_graph import GraphOptions, _TargetBuilder
from specrt.models.gemma4_assistant import AssistantConfig

TARGET_EMBED = "target.embed_tokens.weight"
TARGET_NORM = "target.norm.weight"
INPUTS = ("input_ids", "position_ids", "kv_length", "features", "hidden", "use_features")


class AssistantBuilder(_TargetBuilder):
    def __init__(self, cfg: AssistantConfig, weights, opts: GraphOptions):
        super().__init__(cfg.layer, weights, opts, None)
        self.assistant = cfg

    def build(self):
        a, cfg, g = self.assistant, self.cfg, self.g
        b = a.backbone_hidden_size
        g.add_input("input_ids", TensorProto.INT64, [1, "sequence_length"])
        g.add_input("position_ids", TensorProto.INT64, [1, "sequence_length"])
        g.add_input("kv_length", TensorProto.INT64, [1])
        g.add_input("features", self.elem, [1, "sequence_length", b])
        g.add_input("hidden", self.elem, [1, "sequence_length", b])
        g.add_input("use_features", TensorProto.BOOL, [1])
        caches, starts = {}, {}  # per target layer read: its (keys, values) inputs and the first slot its readers see
        window = g.const([cfg.sliding_window + 1])
        for src, layer in a.readers.items():
            heads, dim = cfg.kv_shape_of(layer)
            caches[src] = (g.add_input(f"past_key_values.{src}.key", self.elem, [1, heads, "max_context", dim]),
                           g.add_input(f"past_key_values.{src}.value", self.elem, [1, heads, "max_context", dim]))
            starts[src] = (g.op("Max", [g.op("Sub", ["kv_length", window]), g.const([0])]) if cfg.is_sliding(layer)
                           else g.const([0]))
        embedded, _ = self.embed_lookup(TARGET_EMBED, b)  # the target's own table (quantized as the target's)
        embedded = g.op("Mul", [embedded, g.const(math.sqrt(b), dtype=self.dtype)])
        features = self.norm("features", TARGET_NORM)
        h = g.op("Where", ["use_features", features, "hidden"])
        x = self.linear(g.op("Concat", [embedded, h], axis=-1), ["pre_projection"], "pre_projection")
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            normed = self.norm(x, p + "input_layernorm.weight")
            src = a.source_of(i)
            keys, values = (g.op("Slice", [t, starts[src], "kv_length", g.const([2])]) for t in caches[src])
            attn = self.read_attention(i, normed, keys, values)
            x = gemma4_layer_rest(self, i, x, attn, None)
        y = self.norm(x, "model.norm.weight")
        logits = self.ordered_logits(y) if a.ordered_embeddings else self.linear(y, ["lm_head"], "lm_head")
        hidden_out = self.linear(y, ["post_projection"], "post_projection")
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
        g.op("Identity", [logits], outputs=["logits"])
        g.op("Identity", [hidden_out], outputs=["hidden_out"])
        g.add_output("logits", TensorProto.FLOAT, [1, "sequence_length", cfg.vocab_size])
        g.add_output("hidden_out", self.elem, [1, "sequence_length", b])
        return g.model()

    def read_attention(self, i: int, h: str, keys: str, values: str) -> str:
        """The layer's query over the given slots of the target's cache: keys/values [1, KV, T, D] (roped keys)."""
        g, cfg = self.g, self.cfg
        p = f"model.layers.{i}.self_attn."
        d, kv, n = cfg.head_dim_of(i), cfg.kv_heads_of(i), cfg.num_heads
        q = self.head_norm(self.linear(h, [p + "q_proj"], f"layers.{i}.q"), n, p + "q_norm.weight", d)
        q = self.rotate(i, g.op("Reshape", [q, g.const([0, 0, n, d])]))  # [1, S, N, D]
        # heads n = kv * G + g: [1, S, N, D] -> [1, N, S, D] -> [1, KV, G * S, D]
        grouped = g.op("Reshape", [g.op("Transpose", [q], perm=[0, 2, 1, 3]), g.const([0, kv, -1, d])])
        scores = g.op("MatMul", [grouped, g.op("Transpose", [keys], perm=[0, 1, 3, 2])])  # [1, KV, G * S, T]
        if cfg.scale_of(i) != 1.0:
            scores = g.op("Mul", [scores, g.const(cfg.scale_of(i), dtype=self.dtype)])
        out = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), values])  # [1, KV, G * S, D]
        out = g.op("Transpose", [g.op("Reshape", [out, g.const([0, n, -1, d])])], perm=[0, 2, 1, 3])  # [1, S, N, D]
        return self.linear(g.op("Reshape", [out, g.const([0, 0, n * d])]), [p + "o_proj"], f"layers.{i}.o_proj")

    def rotate(self, i: int, q: str) -> str:
        """Half-split rotary embedding of q [1, S, N, D] at position_ids (the layer's own frequencies)."""
        g = self.g
        d = self.cfg.head_dim_of(i)
        cos_cache, sin_cache = self.rope_cache(i)  # [M, D / 2]
        cos, sin = (g.op("Unsqueeze", [g.op("Gather", [c, "position_ids"], axis=0), g.const([2])])
                    for c in (cos_cache, sin_cache))  # [1, S, 1, D / 2]
        first, second = g.op("Split", [q, g.const([d // 2, d // 2])], outputs=2, axis=-1)
        return g.op("Concat", [g.op("Sub", [g.op("Mul", [first, cos]), g.op("Mul", [second, sin])]),
                               g.op("Add", [g.op("Mul", [second, cos]), g.op("Mul", [first, sin])])], axis=-1)

    def ordered_logits(self, y: str) -> str:
        """Ordered embeddings: logits of the top centroids' tokens only, every other token at their minimum - 1."""
        g, a = self.g, self.assistant
        v, per = a.vocab_size, a.vocab_size // a.num_centroids
        centroids = self.linear(y, ["masked_embedding.centroids"], "centroids")  # [1, S, C]
        _, top = g.op("TopK", [centroids, g.const([a.centroid_top_k])], outputs=2, axis=-1)  # [1, S, k]
        ordering = np.asarray(self.tensor("masked_embedding.token_ordering")).astype(np.int64).reshape(-1, per)
        ids = g.op("Reshape", [g.op("Gather", [g.weight("token_ordering", ordering), top], axis=0),
                               g.const([0, 0, -1])])  # [1, S, k * per]
        table = g.weight("ordered_table", np.asarray(self.tensor("model.embed_tokens.weight"), np.float32)
                         .astype(self.dtype))
        rows = g.op("Gather", [table, ids], axis=0)  # [1, S, k * per, h]
        picked = g.op("Squeeze", [g.op("MatMul", [rows, g.op("Unsqueeze", [y, g.const([-1])])]), g.const([-1])])
        floor = g.op("Sub", [g.op("ReduceMin", [picked, g.const([-1])], keepdims=1), g.const(1.0, dtype=self.dtype)])
        # floor [1, S, 1] + zeros [V]: no shape arithmetic (which ONNX Runtime would keep on the CPU)
        full = g.op("Add", [floor, g.weight("vocab_zeros", np.zeros(v, dtype=self.dtype))])
        return g.op("ScatterElements", [full, ids, picked], axis=-1)  # [1, S, V]
