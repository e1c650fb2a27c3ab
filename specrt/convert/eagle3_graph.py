"""The EAGLE-3 head as an ONNX graph with its own in-place KV cache (the same fused operators as the target).

Inputs and outputs as convert/head_graph.py describes: features [B, S, 3 * H_target] are the target's hidden
states at the head's three layers (fused by fc); logits [B, S, V_draft] are over the draft vocabulary (target
id = d + d2t[d]); hidden_out is the pre-norm output. Token ids are embedded with the target's table, carried
in the graph. Definition: models/eagle3.py.
"""

from __future__ import annotations

import numpy as np
import onnx

from specrt.convert.head_graph import add_head_inputs, add_head_outputs
from specrt.convert.target_graph import GraphOptions, _TargetBuilder
from specrt.models.eagle3 import Eagle3Config


def _graph_weights(tensors: dict[str, np.ndarray], embed: np.ndarray) -> dict[str, np.ndarray]:
    """Checkpoint names -> the target builder's names for layer 0."""
    out = {"model.embed_tokens.weight": tensors.get("embed_tokens.weight", embed)}
    for name, value in tensors.items():
        if name.startswith("midlayer."):
            out["model.layers.0." + name[len("midlayer."):]] = value
    out["model.norm.weight"] = tensors["norm.weight"]
    out["lm_head.weight"] = tensors["lm_head.weight"]
    out["fc.weight"] = tensors["fc.weight"]
    return out


class _Eagle3Builder(_TargetBuilder):
    def __init__(self, cfg: Eagle3Config, weights: dict[str, np.ndarray], opts: GraphOptions):
        super().__init__(cfg.layer, weights, opts, None)
        self.head = cfg

    def build(self) -> onnx.ModelProto:
        g, head = self.g, self.head
        io = add_head_inputs(self, head.feature_width)
        seqlens_k, total_len = self.attention_lengths()

        emb, _ = self.embed_lookup()  # [B, S, H]
        fused = self.linear("features", ["fc"], "fc")  # [B, S, H]
        hid = g.op("Where", ["use_features", fused, "hidden"])
        p = "model.layers.0."
        normed_hidden = self.norm(hid, p + "hidden_norm.weight")
        residual = normed_hidden if head.norm_before_residual else hid
        x = g.op("Concat", [self.norm(emb, p + "input_layernorm.weight"), normed_hidden], axis=-1)  # [B, S, 2H]
        attn = self.attention(0, x, io, seqlens_k, total_len)
        h, stream = self.norm_with_skip(attn, residual, p + "post_attention_layernorm.weight")
        final, pre = self.norm_with_skip(self.mlp(0, h), stream, "model.norm.weight")
        add_head_outputs(self, self.linear(final, ["lm_head"], "lm_head"), pre, head.draft_vocab_size, io)
        return g.model()


def build_eagle3_graph(cfg: Eagle3Config, tensors: dict[str, np.ndarray], target_embed: np.ndarray,
                       opts: GraphOptions) -> onnx.ModelProto:
    """tensors: the checkpoint's (canonical names); target_embed [V, H]: the target's token embedding."""
    return _Eagle3Builder(cfg, _graph_weights(tensors, target_embed), opts).build()
