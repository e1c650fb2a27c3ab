"""The DFlash drafter as an ONNX graph (definition: models/dflash.py), exported from the torch module.

Inputs: input_ids [1, S] (the anchor token and S - 1 mask tokens, embedded with the target's table carried in
the graph), features [1, C, F] (the target's hidden states at the drafter's layers for the C context positions
it has not read yet), position_ids [1, C + S] (those C positions, then the block's S), and per draft layer
past_key_values.{i}.key|value [1, KV, P, D] (the context read before). Outputs: logits [1, S - 1, V] for the
masked positions (through the target's lm_head, or [1, S - 1, V_draft] through its draft-vocabulary rows) and
present.{i}.key|value [1, KV, P + C, D]: the past plus the new context, never the block, so a rejected draft
leaves nothing to undo. The cache is small (context keys of a few layers) and is carried between calls by the
drafter as arrays.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specrt.models.dflash import DFlashDraft


class DFlashGraphModule(nn.Module):
    """The drafter plus the target's embedding table and lm_head, in the graph's calling convention."""

    def __init__(self, draft: DFlashDraft, embed: np.ndarray, lm_head: np.ndarray, embed_scale: float = 1.0):
        super().__init__()
        self.draft = draft
        self.embed = nn.Parameter(torch.from_numpy(np.ascontiguousarray(embed, dtype=np.float32)), requires_grad=False)
        tied = lm_head is embed or (lm_head.shape == embed.shape and np.shares_memory(lm_head, embed))
        self.lm_head = self.embed if tied else nn.Parameter(
            torch.from_numpy(np.ascontiguousarray(lm_head, dtype=np.float32)), requires_grad=False)
        self.embed_scale = embed_scale

    def forward(self, input_ids, features, position_ids, *past):
        # input_ids [1, S]; features [1, C, F]; position_ids [1, C + S]; past: key, value per layer [1, KV, P, D]
        c = features.shape[1]
        block = self.embed[input_ids]
        if self.embed_scale != 1.0:
            block = block * self.embed_scale
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
        hidden, new = self.draft(features, block, position_ids[:, :c], position_ids[:, c:], pairs)
        logits = hidden[:, 1:] @ self.lm_head.t()  # [1, S - 1, V or V_draft]
        outs = [logits]
        for (pk, pv), (k, v) in zip(pairs, new):
            outs += [torch.cat((pk, k), 2), torch.cat((pv, v), 2)]
        return tuple(outs)


def io_names(layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return ["input_ids", "features", "position_ids", *past], ["logits", *present]


def export_dflash_graph(module: DFlashGraphModule, out: Path) -> None:
    """Write out (.onnx) with its weights in out.data beside it."""
    import onnx

    cfg = module.draft.cfg
    c = cfg.layers
    inputs, outputs = io_names(c.num_layers)
    example = (torch.zeros(1, 4, dtype=torch.int64), torch.zeros(1, 3, cfg.feature_width),
               torch.arange(7)[None], *[torch.zeros(1, c.num_kv_heads, 2, c.head_dim)] * (2 * c.num_layers))
    axes = {"input_ids": {1: "block"}, "features": {1: "context"}, "position_ids": {1: "positions"},
            "logits": {1: "masked"}}
    axes.update({n: {2: "past"} for n in inputs[3:]})
    axes.update({n: {2: "total"} for n in outputs[1:]})
    tmp = out.with_name(out.stem + ".export.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example, str(tmp), input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    model = onnx.load(str(tmp))
    tmp.unlink()
    onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)


def compare_with_torch(session, module: DFlashGraphModule, seed: int = 0) -> float:
    """Max |logit difference| between the graph and the torch module over two calls (the second reads the
    first's cache)."""
    rng = np.random.default_rng(seed)
    cfg = module.draft.cfg
    c = cfg.layers
    vocab = module.embed.shape[0]
    inputs, _ = io_names(c.num_layers)
    past = [np.zeros((1, c.num_kv_heads, 0, c.head_dim), np.float32)] * (2 * c.num_layers)
    start, worst = 0, 0.0
    for ctx, block in ((5, cfg.block_size), (2, cfg.block_size)):
        ids = np.concatenate([rng.integers(0, vocab, (1, 1)), np.full((1, block - 1), cfg.mask_token_id)], 1)
        feats = rng.normal(size=(1, ctx, cfg.feature_width)).astype(np.float32)
        pos = np.arange(start, start + ctx + block)[None].copy()
        pos[0, ctx:] = np.arange(start + ctx, start + ctx + block)
        outs = session.run(None, dict(zip(inputs, [ids, feats, pos, *past])))
        with torch.no_grad():
            ref = module(torch.from_numpy(ids), torch.from_numpy(feats), torch.from_numpy(pos),
                         *[torch.from_numpy(p) for p in past])
        worst = max(worst, *(float(np.abs(a - b.numpy()).max()) for a, b in zip(outs, ref)))
        past = outs[1:]
        start += ctx
    return worst
