"""The EAGLE-3 head as an ONNX graph with its own in-place KV cache (the same fused operators as the target).

Inputs: input_ids [B, S] (target ids, embedded with the target's table carried in the graph), position_ids,
attention_mask, attention_bias (as the target graph), features [B, S, 3 * H_target] (the target's hidden
states at the head's three layers), hidden [B, S, H] (the head's own previous pre-norm output) and
use_features (bool [1]): the first draft step reads the fused target features, later steps their own output.
Outputs: logits [B, S, V_draft] (draft vocabulary; target id = d + d2t[d]), hidden_out [B, S, H] (pre-norm,
fed back as `hidden` next step), present.0.key/value. Definition: models/eagle3.py.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from specrt.convert.target_graph import GraphOptions, _TargetBuilder, io_names
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
        cfg, g, head = self.cfg, self.g, self.head
        io = io_names(cfg)
        kv_shape = self.kv_shape()
        self.add_step_inputs()
        g.add_input("features", self.elem, ["batch_size", "sequence_length", 3 * head.target_hidden_size])
        g.add_input("hidden", self.elem, ["batch_size", "sequence_length", cfg.hidden_size])
        g.add_input("use_features", TensorProto.BOOL, [1])
        g.add_input(io["past_key"][0], self.elem, kv_shape)
        g.add_input(io["past_value"][0], self.elem, kv_shape)

        seqlens_k, total_len = self.attention_lengths()

        embed = g.weight("model.embed_tokens.weight", self.w["model.embed_tokens.weight"].astype(self.dtype))
        emb = g.op("Gather", [embed, "input_ids"], axis=0)  # [B, S, H]
        fused = self.linear("features", ["fc"], "fc")  # [B, S, H]
        hid = g.op("Where", ["use_features", fused, "hidden"])
        p = "model.layers.0."
        normed_hidden = self.norm(hid, p + "hidden_norm.weight")
        residual = normed_hidden if head.norm_before_residual else hid
        x = g.op("Concat", [self.norm(emb, p + "input_layernorm.weight"), normed_hidden], axis=-1)  # [B, S, 2H]
        attn = self.attention(0, x, io, seqlens_k, total_len)
        h, stream = self.norm_with_skip(attn, residual, p + "post_attention_layernorm.weight")
        final, pre = self.norm_with_skip(self.mlp(0, h), stream, "model.norm.weight")
        logits = self.linear(final, ["lm_head"], "lm_head")
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
        g.op("Identity", [logits], outputs=["logits"])
        g.op("Identity", [pre], outputs=["hidden_out"])
        g.add_output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", head.draft_vocab_size])
        g.add_output("hidden_out", self.elem, ["batch_size", "sequence_length", cfg.hidden_size])
        g.add_output(io["present_key"][0], self.elem, kv_shape)
        g.add_output(io["present_value"][0], self.elem, kv_shape)
        return g.model()


def build_eagle3_graph(cfg: Eagle3Config, tensors: dict[str, np.ndarray], target_embed: np.ndarray,
                       opts: GraphOptions) -> onnx.ModelProto:
    """tensors: the checkpoint's (canonical names); target_embed [V, H]: the target's token embedding."""
    return _Eagle3Builder(cfg, _graph_weights(tensors, target_embed), opts).build()


def compare_with_torch(session, head, embed: np.ndarray, steps=((0, 4, True), (4, 1, False), (5, 1, False)),
                       seed: int = 0, max_ctx: int = 16) -> float:
    """Max |logit difference| between an ORT session over the head graph and the torch head, over a call from
    random target features followed by single steps that feed back the head's own hidden output."""
    import torch

    rng = np.random.default_rng(seed)
    c = head.cfg.layer
    past_k = np.zeros((1, c.num_kv_heads, max_ctx, c.head_dim), np.float32)
    past_v = np.zeros_like(past_k)
    tk = tv = torch.zeros(1, c.num_kv_heads, 0, c.head_dim)
    width = 3 * head.cfg.target_hidden_size
    hidden, worst = None, 0.0
    for start, n, use in steps:
        tokens = rng.integers(0, embed.shape[0], size=(1, n))
        pos = np.arange(start, start + n)[None]
        feats = rng.normal(size=(1, n, width)).astype(np.float32) if use else np.zeros((1, n, width), np.float32)
        h_in = hidden if (hidden is not None and not use) else np.zeros((1, n, c.hidden_size), np.float32)
        logits, h_out, past_k, past_v = session.run(None, {
            "input_ids": tokens, "position_ids": pos, "attention_mask": np.ones((1, start + n), np.int64),
            "attention_bias": np.zeros((1, 1, n, start + n), np.float32), "features": feats, "hidden": h_in,
            "use_features": np.array([use]), "past_key_values.0.key": past_k, "past_key_values.0.value": past_v})
        with torch.no_grad():
            hid = head.fuse(torch.from_numpy(feats)) if use else torch.from_numpy(h_in)
            t_logits, t_h, k, v = head(torch.from_numpy(embed[tokens]), hid, torch.from_numpy(pos), tk, tv)
        tk, tv = torch.cat((tk, k), 2), torch.cat((tv, v), 2)
        worst = max(worst, float(np.abs(logits - t_logits.numpy()).max()), float(np.abs(h_out - t_h.numpy()).max()))
        hidden = h_out[:, -1:]
    return worst
