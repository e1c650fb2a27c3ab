"""An MTP module (models/mtp.py) as an ONNX graph with its own in-place KV cache.

Inputs and outputs as convert/head_graph.py describes: features [B, S, H] are the residual stream after the
target's last layer (the graph applies the target's final norm to it), logits [B, S, V] are over the full
target vocabulary, hidden_out is what the layout feeds to its next step (pre-norm for DeepSeek/GLM, normed
for Qwen3-Next and MiMo). The block is built by the target builder's own attention and MLP.
"""

from __future__ import annotations

import numpy as np
import onnx

from specrt.convert.head_graph import add_head_inputs, add_head_outputs
from specrt.convert.target_graph import GraphOptions, _TargetBuilder
from specrt.models.mtp import MtpConfig, SourceTensor


class _ReadWhenUsed(dict):
    """A dict whose SourceTensor values (the target's embedding table and lm_head) are read from the source each
    time the builder asks for them, and dropped after use."""

    def __getitem__(self, name):
        value = super().__getitem__(name)
        return value.read() if isinstance(value, SourceTensor) else value


def _graph_weights(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical MTP names -> the target builder's names for layer 0."""
    out = _ReadWhenUsed(("model.layers.0." + k[len("block."):] if k.startswith("block.") else k, v)
                        for k, v in tensors.items())
    out["model.embed_tokens.weight"] = tensors["embed.weight"]
    out["model.norm.weight"] = tensors["norm.weight"]
    out["lm_head.weight"] = tensors["head.weight"]
    return out


class _MtpBuilder(_TargetBuilder):
    def __init__(self, cfg: MtpConfig, weights: dict[str, np.ndarray], opts: GraphOptions):
        super().__init__(cfg.layer, weights, opts, None)
        self.mtp = cfg

    def build(self) -> onnx.ModelProto:
        g, lay = self.g, self.mtp.layout
        io = add_head_inputs(self, self.mtp.feature_width)
        seqlens_k, total_len = self.attention_lengths()

        emb, _ = self.embed_lookup()  # [B, S, H]
        if lay.mask_first_position:  # the embedding at position 0 is zeroed
            keep = g.op("Not", [g.op("Equal", ["position_ids", g.const(0)])])
            keep = g.op("Unsqueeze", [g.op("Cast", [keep], to=self.elem), g.const([-1])])  # [B, S, 1]
            emb = g.op("Mul", [emb, keep])
        hid = g.op("Where", ["use_features", self.norm("features", "target_norm.weight"), "hidden"])
        e, h = self.norm(emb, "enorm.weight"), self.norm(hid, "hnorm.weight")
        x = self.linear(g.op("Concat", [h, e] if lay.hidden_first else [e, h], axis=-1), ["proj"], "proj")  # [B, S, H]
        p = "model.layers.0."
        attn = self.attention(0, self.norm(x, p + "input_layernorm.weight"), io, seqlens_k, total_len)
        h, stream = self.norm_with_skip(attn, x, p + "post_attention_layernorm.weight")
        final, pre = self.norm_with_skip(self.mlp(0, h), stream, "model.norm.weight")
        logits = self.linear(final, ["lm_head"], "lm_head")
        add_head_outputs(self, logits, final if lay.feed_normed else pre, self.cfg.vocab_size, io)
        return g.model()


def build_mtp_graph(cfg: MtpConfig, tensors: dict[str, np.ndarray], opts: GraphOptions) -> onnx.ModelProto:
    """tensors: canonical names from models.mtp.load_mtp_from_target."""
    return _MtpBuilder(cfg, _graph_weights(tensors), opts).build()
