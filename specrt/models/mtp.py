"""MTP (multi-token prediction) modules that ship inside a target's own checkpoint: torch definition and the
three public weight layouts.

An MTP module predicts x_{t+2} at position t from the target's last hidden state h_t and the next token's
embedding e(x_{t+1}): x = proj(concat(enorm(e), hnorm(h))) (MiMo concatenates the other way round), one
decoder block of the target's own shape with its own KV cache, a final norm, and an lm_head (DeepSeek's
`shared_head.head`, else the target's). The first draft step reads h_t = the target's final-normed hidden
state (what feeds its lm_head; the graph computes it from the residual stream after the last layer with the
target's final norm), later steps read the module's own output: the pre-norm residual for DeepSeek/GLM, the
normed output for Qwen3-Next and MiMo (as vLLM chains them). DeepSeek and MiMo zero the embedding at
position 0 (as vLLM does).

Layouts (names after the loader's "model." normalization; N = the target's num_hidden_layers):
- deepseek (DeepSeek-V3, GLM-4.5): model.layers.{N}.{enorm, hnorm, eh_proj, shared_head.norm,
  shared_head.head (optional), embed_tokens (optional, the target's is used), the block's own names}
- qwen3_next: mtp.{pre_fc_norm_embedding, pre_fc_norm_hidden, fc, norm, layers.0.<block>} (Qwen3-Next, and
  Qwen3.5 / 3.6, whose block is a gated full-attention block with (1 + w) norms)
- mimo: model.mtp_layers.0.{token_layernorm, hidden_layernorm, input_proj, final_layernorm, <block>}
Only the first module is used; several draft steps chain it. The block is the target's (llama family: dense
attention + MLP; Qwen3.5: gated full attention; Qwen3.5-MoE / Qwen3.6-35B-A3B: gated full attention and the same
mixture of experts with a shared expert as the target's layers, models/moe.py), so DeepSeek-V3's own MoE (sigmoid
routing over expert groups) and MLA blocks are refused by the target loader before this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from specrt import archs
from specrt.errors import SourceError
from specrt.models.config import ModelConfig
from specrt.models.transformer import RMSNorm, block as layer_block, causal_mask


@dataclass(frozen=True)
class Layout:
    name: str
    marker: str  # a tensor (relative to the prefix) whose presence identifies the layout
    renames: dict  # layout name -> canonical name, for the tensors outside the block
    block_prefix: str  # where the block's tensors sit, relative to the prefix
    hidden_first: bool  # concat order [hidden, embedding] (MiMo) instead of [embedding, hidden]
    mask_first_position: bool  # zero the embedding at position 0
    feed_normed: bool  # chained steps read the normed output (else the pre-norm residual)
    optional: tuple[str, ...] = ()  # tensors that may be present and are not used


LAYOUTS = (
    Layout("deepseek", "eh_proj.weight",
           {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "proj.weight",
            "shared_head.norm.weight": "norm.weight", "shared_head.head.weight": "head.weight"},
           "", hidden_first=False, mask_first_position=True, feed_normed=False, optional=("embed_tokens.weight",)),
    Layout("qwen3_next", "fc.weight",
           {"pre_fc_norm_embedding.weight": "enorm.weight", "pre_fc_norm_hidden.weight": "hnorm.weight",
            "fc.weight": "proj.weight", "norm.weight": "norm.weight"},
           "layers.0.", hidden_first=False, mask_first_position=False, feed_normed=True),
    Layout("mimo", "input_proj.weight",
           {"token_layernorm.weight": "enorm.weight", "hidden_layernorm.weight": "hnorm.weight",
            "input_proj.weight": "proj.weight", "final_layernorm.weight": "norm.weight"},
           "", hidden_first=True, mask_first_position=True, feed_normed=True),
)


def block_config(target: ModelConfig) -> ModelConfig:
    """The target's config cut to the MTP module's one block: a full-attention block (a hybrid's MTP layer is
    gated full attention, whatever its target's layers are)."""
    return dataclasses.replace(target, num_layers=1, layer_types=("full_attention",) if target.layer_types else ())


def layout_prefix(layout: Layout, num_layers: int) -> str:
    return {"deepseek": f"model.layers.{num_layers}.", "qwen3_next": "model.mtp.",
            "mimo": "model.mtp_layers.0."}[layout.name]


@dataclass(frozen=True)
class MtpConfig:
    layer: ModelConfig  # the target's config with one layer: the block's shape
    layout: Layout
    own_head: bool  # the module brings its lm_head (DeepSeek's shared_head.head)
    target_layers: int = 0  # the target's layer count (the module reads the last one's residual stream)

    @property
    def feature_width(self) -> int:  # what it reads from the target per position: the last hidden state
        return self.layer.hidden_size

    @property
    def target_hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return (self.target_layers - 1,)

    @property
    def draft_vocab_size(self) -> int:
        return self.layer.vocab_size


class MtpModule(nn.Module):
    def __init__(self, cfg: MtpConfig):
        super().__init__()
        c = cfg.layer
        h, norm = c.hidden_size, (c.hidden_size, c.rms_norm_eps, c.norm_offset)
        self.cfg = cfg
        self.enorm, self.hnorm, self.norm, self.target_norm = RMSNorm(*norm), RMSNorm(*norm), RMSNorm(*norm), RMSNorm(*norm)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.block = layer_block(c, 0)
        self.head = nn.Linear(h, c.vocab_size, bias=False)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The residual stream after the target's last layer [B, S, H] -> its final-normed hidden state."""
        return self.target_norm(features)

    def target_ids(self) -> torch.Tensor:
        """Target token id of every output id [V] (the whole vocabulary)."""
        return torch.arange(self.cfg.layer.vocab_size, device=self.head.weight.device)

    def forward(self, embeds, hidden, position_ids, past_k, past_v, attention_bias=None):
        """embeds [B, S, H] (target embeddings of x_{t+1}), hidden [B, S, H] (fused target state or the
        previous step's output). Returns logits [B, S, V], the hidden state to feed back [B, S, H] and
        the new keys/values [B, KV, S, D]."""
        lay = self.cfg.layout
        mask = causal_mask(self.cfg.layer, 0, position_ids, past_k.shape[2])
        if attention_bias is not None:
            mask = mask + attention_bias
        if lay.mask_first_position:
            embeds = embeds * (position_ids != 0)[..., None].to(embeds.dtype)
        e, hh = self.enorm(embeds), self.hnorm(hidden)
        x = self.proj(torch.cat((hh, e) if lay.hidden_first else (e, hh), dim=-1))
        x, k, v = self.block(x, position_ids, past_k, past_v, mask)
        normed = self.norm(x)
        return self.head(normed), (normed if lay.feed_normed else x), k, v


def expected_shapes(cfg: MtpConfig) -> dict[str, tuple[int, ...]]:
    """Canonical tensor names and shapes (block.* as the target's block names them)."""
    c = cfg.layer
    h = c.hidden_size
    block = {f"block.{k}": tuple(v.shape) for k, v in layer_block(c, 0).state_dict().items()}
    return {"enorm.weight": (h,), "hnorm.weight": (h,), "proj.weight": (h, 2 * h), "norm.weight": (h,), **block}


def find_layout(weights: dict, target: ModelConfig) -> Layout:
    for layout in LAYOUTS:
        if layout_prefix(layout, target.num_layers) + layout.marker in weights:
            return layout
    raise SourceError(
        f"the target's checkpoint has no MTP module (looked for model.layers.{target.num_layers}.eh_proj "
        "(DeepSeek-V3/GLM-4.5), mtp.fc (Qwen3-Next) and model.mtp_layers.0.input_proj (MiMo))")


class SourceTensor:
    """A large tensor the module shares with its target (its embedding table, its lm_head), left in the source
    until used: `read()` the whole of it, `[ids]` only those rows (conversion need not hold a 248k x 4096 table
    twice, or at all while it validates)."""

    def __init__(self, weights, name: str):
        from specrt.models.tensor_source import shape_of

        self.weights, self.name = weights, name
        self.shape = tuple(shape_of(weights, name))

    def read(self) -> np.ndarray:
        return np.asarray(self.weights[self.name], dtype=np.float32)

    def __getitem__(self, ids) -> np.ndarray:
        from specrt.models.tensor_source import rows_of

        ids = np.asarray(ids)
        rows = rows_of(self.weights, self.name, ids.reshape(-1))
        return np.asarray(rows, dtype=np.float32).reshape(*ids.shape, self.shape[-1])


def load_mtp_from_target(target: ModelConfig, weights: dict[str, np.ndarray],
                         lazy_shared: bool = False) -> tuple[MtpConfig, dict[str, np.ndarray]]:
    """The target's first MTP module: config and canonical tensors (enorm, hnorm, proj, norm, block.*, head,
    target_norm, embed). SourceError names a missing, unexpected or misshaped tensor. lazy_shared: the target's
    embedding table and lm_head come as SourceTensors, read when used."""
    if not archs.of(target).mtp_sources:
        supported = ", ".join(a.name for a in archs.ARCHS.values() if a.mtp_sources)
        raise SourceError(f"MTP modules are supported for {supported} targets; this target is {target.model_type}")
    layout = find_layout(weights, target)
    prefix = layout_prefix(layout, target.num_layers)
    found = {k[len(prefix):]: weights[k] for k in weights if k.startswith(prefix)}  # reads only these
    if layout.name == "qwen3_next":  # only module 0; a later module's tensors are not this one's extras
        found = {k: v for k, v in found.items() if not k.startswith("layers.") or k.startswith("layers.0.")}
    layer = block_config(target)
    cfg = MtpConfig(layer, layout, own_head=layout.name == "deepseek" and "shared_head.head.weight" in found,
                    target_layers=target.num_layers)
    tensors: dict[str, np.ndarray] = {}
    for name, value in found.items():
        if name in layout.renames:
            tensors[layout.renames[name]] = value
        elif name in layout.optional:
            continue
        elif name.startswith(layout.block_prefix):
            tensors["block." + name[len(layout.block_prefix):]] = value
        else:
            tensors["unexpected:" + name] = value
    want = expected_shapes(cfg)
    extra = sorted(k for k in tensors if k not in want and k != "head.weight")
    if extra:
        raise SourceError(f"MTP module ({layout.name} layout) has an unexpected tensor {prefix}{_layout_name(layout, extra[0])}")
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise SourceError(f"MTP module ({layout.name} layout) lacks tensor {prefix}{_layout_name(layout, missing[0])}")
    for name, shape in want.items():
        if tuple(tensors[name].shape) != shape:
            raise SourceError(f"MTP tensor {prefix}{_layout_name(layout, name)} has shape "
                              f"{tuple(tensors[name].shape)}, expected {shape}")
    if "head.weight" not in tensors:
        name = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
        tensors["head.weight"] = SourceTensor(weights, name) if lazy_shared else weights[name]
    if tuple(tensors["head.weight"].shape) != (target.vocab_size, target.hidden_size):
        raise SourceError(f"MTP head has shape {tuple(tensors['head.weight'].shape)}, expected "
                          f"{(target.vocab_size, target.hidden_size)}")
    tensors["target_norm.weight"] = weights["model.norm.weight"]
    embed = "model.embed_tokens.weight"
    tensors["embed.weight"] = SourceTensor(weights, embed) if lazy_shared else weights[embed]
    return cfg, tensors


def _layout_name(layout: Layout, canonical: str) -> str:
    """A canonical name back in the checkpoint's own spelling (for error messages)."""
    if canonical.startswith("unexpected:"):
        return canonical[len("unexpected:"):]
    for theirs, ours in layout.renames.items():
        if ours == canonical:
            return theirs
    return layout.block_prefix + canonical[len("block."):] if canonical.startswith("block.") else canonical


def model_from_tensors(cfg: MtpConfig, tensors: dict[str, np.ndarray]) -> tuple[MtpModule, np.ndarray]:
    """The torch module (strictly loaded) and the target's embedding table [V, H] (a SourceTensor stays one: rows
    are read when looked up). A SourceTensor head is left empty ([0, H]) for the caller to fill."""
    model = MtpModule(cfg).eval()
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in tensors.items()
             if k != "embed.weight" and not isinstance(v, SourceTensor)}
    lazy = [k for k, v in tensors.items() if k != "embed.weight" and isinstance(v, SourceTensor)]
    for name in lazy:  # no V x H allocation now: the conversion fills it after the graph is written
        module, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module), attr, torch.nn.Parameter(torch.empty(0, cfg.layer.hidden_size)))
    model.load_state_dict(state, strict=not lazy)
    embed = tensors["embed.weight"]
    return model, embed if isinstance(embed, SourceTensor) else np.asarray(embed, dtype=np.float32)


def save_mtp_checkpoint(folder, cfg: MtpConfig, tensors: dict[str, np.ndarray], half: bool = False) -> None:
    """Write a module in the DeepSeek-V3 layout (model.layers.{N}.*, with shared_head.head), which vLLM's and
    SGLang's MTP loaders read beside the target's weights and `specrt convert TARGET --drafter mtp:FOLDER`
    reads from the folder: config.json (num_nextn_predict_layers, the target's layer count) + model.safetensors."""
    import json
    from pathlib import Path

    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    layout = next(lay for lay in LAYOUTS if lay.name == "deepseek")
    names = mtp_tensor_names(layout, dataclasses.replace(cfg.layer, num_layers=cfg.target_layers))
    names["head.weight"] = f"model.layers.{cfg.target_layers}.shared_head.head.weight"
    out = {}
    for canonical, name in names.items():
        value = np.asarray(tensors[canonical])
        out[name] = np.ascontiguousarray(value.astype(np.float16) if half else value.astype(np.float32))
    save_file(out, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DeepSeekMTPModel"], "mtp_layout": "deepseek", "num_nextn_predict_layers": 1,
        "num_hidden_layers": cfg.target_layers, "hidden_size": cfg.layer.hidden_size,
        "vocab_size": cfg.layer.vocab_size}, indent=2))


def mtp_tensor_names(layout: Layout, target: ModelConfig) -> dict[str, str]:
    """Canonical name -> checkpoint name for every tensor of a module in this layout (used to write test
    checkpoints and to name tensors in errors)."""
    prefix = layout_prefix(layout, target.num_layers)
    cfg = MtpConfig(block_config(target), layout, own_head=False)
    return {name: prefix + _layout_name(layout, name) for name in expected_shapes(cfg)}
