"""DFlash block-diffusion drafter (z-lab, "DFlash: Block Diffusion for Flash Speculative Decoding", 2026):
torch definition and the checkpoint layout of the reference implementation (z-lab/dflash, which SGLang and
vLLM load).

The drafter reads the target's hidden states after several layers (`target_layer_ids`; layer i is the
residual stream after decoder layer i, HF's hidden_states[i + 1]), concatenated [.., n * H_target] and fused
by `fc` + `hidden_norm` into one context vector per position. Its input block is the target's embedding of
the last accepted token followed by `block_size - 1` mask tokens. In every draft layer (Qwen3-style: q/k norm)
the queries come from the block, the keys and values from [context; block], with rotary positions over both,
and attention is not causal: one forward pass predicts every masked position. The final norm's output goes
through the target's lm_head. Context keys/values are cached across calls (they depend only on the fused
features, not on earlier draft layers), the block's are not.

Checkpoint (a folder): config.json (a Qwen3 config: hidden_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, rope_theta, vocab_size, plus
`dflash_config: {target_layer_ids, block_size, mask_token_id}`, or those keys at the top level) and safetensors
with fc.weight, hidden_norm.weight, norm.weight and layers.{i}.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm}.weight. No embedding, no lm_head.

specrt's extension: an optional int64 tensor `d2t` [V_draft] restricts the drafter's output to a draft
vocabulary, as EAGLE-3's does (draft id d is target id d + d2t[d]). The lm_head then holds only those rows of
the target's, which is most of a call's cost on a CPU (7 rows x 49152 x 576 for the default model). A checkpoint
without it predicts over the whole target vocabulary, as the reference does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specrt.errors import SourceError
from specrt.models.checkpoint_folder import check_tensors, open_checkpoint, tensor_refs
from specrt.models.tensor_source import LazyWeights, rows_of, shape_of
from specrt.models.config import ModelConfig, config_from_hf
from specrt.models.layer_ids import dflash_layers
from specrt.models.transformer import MLP, RMSNorm, rotate

ARCHITECTURE = "DFlashDraftModel"
D2T = "d2t"  # optional draft vocabulary (see the module docstring)
LM_HEAD = "lm_head.weight"  # optional: the drafter's own output rows (else the target's lm_head)


@dataclass(frozen=True)
class DFlashConfig:
    layers: ModelConfig  # shape of the draft layers (Qwen3 blocks)
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int

    @property
    def feature_width(self) -> int:
        return len(self.target_layer_ids) * self.target_hidden_size

    def to_hf(self) -> dict:
        c = self.layers
        return {
            "architectures": [ARCHITECTURE], "model_type": "qwen3", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "num_hidden_layers": c.num_layers,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope.theta, "max_position_embeddings": c.max_position,
            "vocab_size": c.vocab_size, "hidden_act": c.hidden_act, "attention_bias": False,
            "tie_word_embeddings": False, "num_target_layers": None, "target_hidden_size": self.target_hidden_size,
            "dflash_config": {"target_layer_ids": list(self.target_layer_ids), "block_size": self.block_size,
                              "mask_token_id": self.mask_token_id},
        }


def dflash_config_from_hf(hf: dict, target: ModelConfig, where: str = "DFlash config") -> DFlashConfig:
    """Read a DFlash config.json (the reference layout, or the speculators format) against its target
    (mismatches are SourceErrors naming the field)."""
    if "speculators_config" in hf:  # the layers' shape is in transformer_layer_config
        inner = hf.get("transformer_layer_config")
        if not isinstance(inner, dict):
            raise SourceError(f"{where}: a speculators config needs a transformer_layer_config object")
        hf = {**inner, **{k: hf[k] for k in ("speculators_config", "aux_hidden_state_layer_ids", "mask_token_id",
                                              "block_size", "target_hidden_size") if hf.get(k) is not None}}
    extra = hf.get("dflash_config") or {}

    def value(name, default=None):
        return extra.get(name, hf.get(name, default))

    layers = config_from_hf({**hf, "model_type": "qwen3", "tie_word_embeddings": False})
    ids = dflash_layers(hf, target.num_layers, where)
    mask = value("mask_token_id")
    cfg = DFlashConfig(layers, int(hf.get("target_hidden_size") or layers.hidden_size), ids,
                       int(value("block_size", 16)), -1 if mask is None else int(mask))
    if cfg.target_hidden_size != target.hidden_size:
        raise SourceError(f"DFlash drafter reads hidden size {cfg.target_hidden_size}, the target has {target.hidden_size}")
    if layers.hidden_size != target.hidden_size:
        raise SourceError(f"DFlash drafter has hidden size {layers.hidden_size}; it embeds with the target's "
                          f"table of width {target.hidden_size}")
    if layers.vocab_size != target.vocab_size:
        raise SourceError(f"DFlash drafter has vocabulary {layers.vocab_size}, the target has {target.vocab_size}")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise SourceError(f"DFlash mask token id {cfg.mask_token_id} is not in the target's vocabulary of "
                          f"{target.vocab_size} (its embedding table has no row for it)")
    if cfg.block_size < 2:
        raise SourceError(f"DFlash block size {cfg.block_size}: at least 2 (the anchor token and one mask)")
    return cfg


class DFlashAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, 0.0)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, 0.0)
        self.register_buffer("inv_freq", torch.tensor(cfg.rope.inv_freq(d), dtype=torch.float32), persistent=False)

    def _rope(self, x, positions):
        angles = positions.to(torch.float32)[..., None] * self.inv_freq  # [B, T, D/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, D]
        return rotate(x, angles.cos(), angles.sin())

    def forward(self, x, ctx, ctx_pos, block_pos, past_k, past_v, mask=None):
        """x [B, S, H] (normed block); ctx [B, C, H] (fused context); positions [B, C] / [B, S];
        past_k/v [B, KV, P, D] (earlier context); mask [B, 1, S, P + C + S] additive or None (all visible).
        Returns output [B, S, H] and the context's keys/values [B, KV, C, D]."""
        cfg = self.cfg
        b, s, _ = x.shape
        c = ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, s, cfg.num_heads, cfg.head_dim)).transpose(1, 2)
        both = torch.cat((ctx, x), dim=1)  # [B, C + S, H]
        k = self.k_norm(self.k_proj(both).view(b, c + s, cfg.num_kv_heads, cfg.head_dim)).transpose(1, 2)
        v = self.v_proj(both).view(b, c + s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q = self._rope(q, block_pos)
        k = self._rope(k, torch.cat((ctx_pos, block_pos), dim=1))
        k_all, v_all = torch.cat((past_k, k), 2), torch.cat((past_v, v), 2)  # [B, KV, P + C + S, D]
        groups = cfg.num_heads // cfg.num_kv_heads
        qg = q.reshape(b, cfg.num_kv_heads, groups * s, cfg.head_dim)  # heads kv-major: h = kv * groups + g
        scores = (qg @ k_all.transpose(-1, -2)) * cfg.scale  # [B, KV, G * S, T]
        if mask is not None:
            scores = (scores.view(b, cfg.num_kv_heads, groups, s, -1) + mask[:, :, None]).view_as(scores)
        out = torch.softmax(scores, dim=-1) @ v_all  # [B, KV, G * S, D]
        out = out.view(b, cfg.num_heads, s, cfg.head_dim).transpose(1, 2).reshape(b, s, -1)
        return self.o_proj(out), k[:, :, :c], v[:, :, :c]


class DFlashLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, 0.0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, 0.0)


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        c = cfg.layers
        self.cfg = cfg
        self.fc = nn.Linear(cfg.feature_width, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, 0.0)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, 0.0)

    def forward(self, features, block_embeds, ctx_pos, block_pos, past, mask=None):
        """features [B, C, F] (new context positions), block_embeds [B, S, H] (target embeddings of the anchor
        token and the masks), past: per layer (k, v) [B, KV, P, D]. Returns the normed hidden state of every
        block position [B, S, H] and, per layer, the new context keys/values [B, KV, C, D]."""
        ctx = self.hidden_norm(self.fc(features))
        x, new = block_embeds, []
        for layer, (pk, pv) in zip(self.layers, past):
            a, k, v = layer.self_attn(layer.input_layernorm(x), ctx, ctx_pos, block_pos, pk, pv, mask)
            x = x + a
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            new.append((k, v))
        return self.norm(x), new

    def empty_cache(self, batch: int = 1):
        c = self.cfg.layers
        z = torch.zeros(batch, c.num_kv_heads, 0, c.head_dim)
        return [(z, z) for _ in self.layers]


def expected_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    c = cfg.layers
    h, d = c.hidden_size, c.head_dim
    out = {"fc.weight": (h, cfg.feature_width), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        out.update({
            p + "self_attn.q_proj.weight": (c.num_heads * d, h), p + "self_attn.k_proj.weight": (c.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": (c.num_kv_heads * d, h), p + "self_attn.o_proj.weight": (h, c.num_heads * d),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, h), p + "mlp.up_proj.weight": (c.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, c.intermediate_size),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    return out


def open_dflash_checkpoint(folder: Path, target: ModelConfig) -> tuple[DFlashConfig, LazyWeights, np.ndarray | None]:
    """Config, the tensors (checked by name and shape, read when used) and the d2t map (or None) of a DFlash
    checkpoint folder; SourceError names the first problem."""
    folder = Path(folder)
    hf, files = open_checkpoint(folder, "a DFlash checkpoint folder")
    cfg = dflash_config_from_hf(hf, target, f"{folder}/config.json")
    refs = tensor_refs(files, lambda name: name.removeprefix("model."))
    check_tensors(folder, refs, expected_shapes(cfg), "DFlash checkpoint", optional={D2T, LM_HEAD})
    d2t = None
    if D2T in refs:
        d2t = refs.pop(D2T).read()
        draft_vocab_targets(folder, d2t, target.vocab_size)  # raises on a bad map
        d2t = d2t.astype(np.int64)
    if LM_HEAD in refs:  # its own output rows (what vLLM needs with a draft vocabulary): one per draft id
        rows = target.vocab_size if d2t is None else len(d2t)
        if tuple(refs[LM_HEAD].shape) != (rows, cfg.layers.hidden_size):
            raise SourceError(f"{folder}: tensor {LM_HEAD} has shape {tuple(refs[LM_HEAD].shape)}, expected "
                              f"{(rows, cfg.layers.hidden_size)} (one row per {'draft' if d2t is not None else 'target'} "
                              f"vocabulary id)")
    return cfg, LazyWeights(refs), d2t


def load_dflash_checkpoint(folder: Path, target: ModelConfig) -> tuple[DFlashConfig, dict[str, np.ndarray]]:
    """Config and tensors (float32, in memory; d2t int64 where there is one) of a DFlash checkpoint folder."""
    cfg, weights, d2t = open_dflash_checkpoint(folder, target)
    out = {k: np.asarray(weights[k], dtype=np.float32) for k in weights}
    if d2t is not None:
        out[D2T] = d2t
    return cfg, out


def draft_vocab_targets(folder: Path, d2t: np.ndarray, vocab_size: int) -> np.ndarray:
    """Target id of each draft id [V_draft] (int64); a d2t that is not a set of distinct target ids in
    increasing order is a SourceError."""
    if d2t.ndim != 1 or not np.issubdtype(d2t.dtype, np.integer) or len(d2t) == 0:
        raise SourceError(f"{folder}: DFlash d2t must be a non-empty 1-D integer tensor, got {d2t.dtype} "
                          f"{tuple(d2t.shape)}")
    ids = np.arange(len(d2t), dtype=np.int64) + d2t.astype(np.int64)
    if ids[0] < 0 or ids[-1] >= vocab_size or np.any(np.diff(ids) <= 0):
        raise SourceError(f"{folder}: DFlash d2t maps to ids outside the target's vocabulary of {vocab_size} or "
                          f"not increasing")
    return ids


def d2t_for(draft_ids: np.ndarray) -> np.ndarray:
    """The d2t offsets [V_draft] of a sorted array of target ids."""
    return np.asarray(draft_ids, np.int64) - np.arange(len(draft_ids), dtype=np.int64)


def save_dflash_checkpoint(folder: Path, cfg: DFlashConfig, tensors: dict[str, np.ndarray]) -> None:
    """Write the reference layout: config.json + model.safetensors (with d2t when tensors has one)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    want = {**expected_shapes(cfg), D2T: None}
    save_file({k: np.ascontiguousarray(v.astype(np.int64) if k == D2T else v) for k, v in tensors.items() if k in want},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))


def model_from_tensors(cfg: DFlashConfig, tensors: dict[str, np.ndarray]) -> DFlashDraft:
    model = DFlashDraft(cfg).eval()
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items() if k not in (D2T, LM_HEAD)},
                          strict=True)
    return model


def state_dict_of(model: DFlashDraft) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def run_dflash_layerwise(cfg: DFlashConfig, weights, calls, head_chunk: int = 16384,
                         confidence: dict | None = None) -> list[list[np.ndarray]]:
    """The drafter's outputs for consecutive calls (each reads the caches of those before), computed one layer
    at a time: each layer's weights are in memory only while it runs, the lm_head is read in chunks of rows.

    weights: the graph's names (convert/dflash_graph.py DFlashWeights, or its int4 readback); calls: (input_ids
    [1, S], features [1, C, F], position_ids [1, C + S]). Returns per call [logits [1, S - 1, V_out], then
    present key, value [1, KV, P + C, D] per layer, then where `confidence` (a confidence head's tensors,
    models/dflash_confidence.py) is given accept_logits [1, S - 1]], as the graph returns them."""
    from specrt.models.layerwise import load_module

    c = cfg.layers
    with torch.no_grad():
        fc = torch.from_numpy(np.require(weights["fc.weight"], np.float32, requirements="W"))
        norm = RMSNorm(c.hidden_size, c.rms_norm_eps, 0.0)
        norm.weight.copy_(torch.from_numpy(np.asarray(weights["hidden_norm.weight"], np.float32)))
        ctxs = [norm(torch.from_numpy(feats) @ fc.t()) for _, feats, _ in calls]  # [1, C, H]
        del fc
        xs = [torch.from_numpy(np.asarray(rows_of(weights, "model.embed_tokens.weight", ids[0]), np.float32))[None]
              for ids, _, _ in calls]  # [1, S, H]
        presents: list[list[torch.Tensor]] = [[] for _ in calls]
        empty = torch.zeros(1, c.num_kv_heads, 0, c.head_dim)
        for i in range(c.num_layers):
            with torch.device("meta"):
                layer = DFlashLayer(c)
            layer = load_module(layer, weights, f"model.layers.{i}.")
            layer.self_attn.inv_freq = torch.tensor(c.rope.inv_freq(c.head_dim), dtype=torch.float32)
            pk = pv = empty
            for n, (_, feats, pos) in enumerate(calls):
                ctx_len = feats.shape[1]
                positions = torch.from_numpy(pos)
                a, k, v = layer.self_attn(layer.input_layernorm(xs[n]), ctxs[n], positions[:, :ctx_len],
                                          positions[:, ctx_len:], pk, pv)
                xs[n] = xs[n] + a
                xs[n] = xs[n] + layer.mlp(layer.post_attention_layernorm(xs[n]))
                pk, pv = torch.cat((pk, k), 2), torch.cat((pv, v), 2)
                presents[n] += [pk, pv]
            del layer
        norm.weight.copy_(torch.from_numpy(np.asarray(weights["model.norm.weight"], np.float32)))
        finals = [norm(x)[:, 1:] for x in xs]  # [1, S - 1, H]
        vocab = shape_of(weights, "lm_head.weight")[0]
        logits = [np.empty((1, f.shape[1], vocab), np.float32) for f in finals]
        for lo in range(0, vocab, head_chunk):
            ids = np.arange(lo, min(lo + head_chunk, vocab))
            rows = torch.from_numpy(np.asarray(rows_of(weights, "lm_head.weight", ids), np.float32))  # [chunk, H]
            for out, f in zip(logits, finals):
                out[..., lo:lo + len(ids)] = (f @ rows.t()).numpy()
    outs = [[lg] + [t.numpy() for t in p] for lg, p in zip(logits, presents)]
    if confidence is not None:
        from specrt.models.dflash_confidence import accept_logits

        for out, f, lg in zip(outs, finals, logits):
            out.append(accept_logits(f.numpy(), lg, confidence).astype(np.float32))
    return outs

