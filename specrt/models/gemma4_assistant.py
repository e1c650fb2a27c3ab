"""Gemma 4's assistant drafter (HF `gemma4_assistant`, Gemma4AssistantForCausalLM): its config checked against a
target, and its torch reference.

The assistant keeps no KV cache: each of its layers (Gemma 4 layers with only a query projection) attends over the
target's own cache, its sliding layers over the last sliding layer of the target that keeps a cache, its full
layers over the last such full layer. A draft step at position p (the position of the newest token, which the
target has not read yet) reads the target's committed slots: all of 0..p-1 for full layers, the last
`sliding_window` of them for sliding layers. Its input is pre_projection([E_t[token] * sqrt(B) ; h]) where E_t is the
target's embedding table, B the target's hidden size and h the target's final-normed hidden state of the token
before (the first step) or the assistant's own post_projection output of its previous step (later steps, still at
position p). The output head is the assistant's own tied embedding table, or (E2B/E4B's assistants, "ordered
embeddings") the rows of the top centroid_top_k centroids' tokens only, every other token at the selected logits'
minimum - 1.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from specrt import archs
from specrt.errors import SourceError
from specrt.models.config import ModelConfig, config_from_hf
from specrt.models.transformer import RMSNorm

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class AssistantConfig:
    layer: ModelConfig  # the assistant's own layers (Gemma 4, every one reading the target's cache)
    backbone_hidden_size: int  # B: the target's hidden size
    ordered_embeddings: bool
    num_centroids: int
    centroid_top_k: int
    sources: tuple[int, int]  # the target layers its sliding and full layers read (-1: it has none of that kind)

    @property
    def vocab_size(self) -> int:
        return self.layer.vocab_size

    def source_of(self, layer: int) -> int:
        """The target layer whose cache the assistant's layer reads."""
        return self.sources[0] if self.layer.is_sliding(layer) else self.sources[1]

    @property
    def readers(self) -> dict[int, int]:
        """Each target layer the assistant reads -> the first of its layers that reads it (its kind and cache
        shape), by target layer."""
        first: dict[int, int] = {}
        for i in range(self.layer.num_layers):
            first.setdefault(self.source_of(i), i)
        return dict(sorted(first.items()))


def target_sources(target: ModelConfig) -> tuple[int, int]:
    """The last cached sliding and full layer of the target (-1 where it has none)."""
    cached = target.attention_layers
    sliding = [i for i in cached if target.is_sliding(i)]
    full = [i for i in cached if not target.is_sliding(i)]
    return (sliding[-1] if sliding else -1, full[-1] if full else -1)


def assistant_config_from_hf(hf: dict, target: ModelConfig, where: str = "assistant") -> AssistantConfig:
    """The assistant's config, checked against the target: a mismatch of the backbone width, the vocabulary, a
    layer kind the target has no cache of, or a head size / KV head count that differs from the target layer it
    reads is a one-line SourceError naming both values."""
    if not isinstance(hf, dict) or hf.get("model_type") != "gemma4_assistant":
        got = hf.get("model_type") if isinstance(hf, dict) else None
        raise SourceError(f"{where}: config.json's model_type is {got!r}, expected 'gemma4_assistant'")
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise SourceError(f"{where}: a gemma4_assistant config needs a text_config object")
    for key in ("hidden_size_per_layer_input", "enable_moe_block", "use_double_wide_mlp"):
        if text.get(key):
            raise SourceError(f"{where}: an assistant's text_config must not set {key} (got {text[key]!r})")
    text = {**text, "model_type": "gemma4_text", "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
            "tie_word_embeddings": True}
    layer = config_from_hf(text)
    layer = dataclasses.replace(layer, kv_shared_layers=layer.num_layers, final_softcap=0.0)  # every layer reads
    backbone = int(hf.get("backbone_hidden_size", 1536))
    if backbone != target.hidden_size:
        raise SourceError(f"{where}: its backbone_hidden_size is {backbone}, the target's hidden size is "
                          f"{target.hidden_size}")
    if layer.vocab_size != target.vocab_size:
        raise SourceError(f"{where}: its vocabulary has {layer.vocab_size} tokens, the target's {target.vocab_size}")
    if not archs.of(target).assistant:
        raise SourceError(f"{where}: a Gemma 4 assistant drafts for a Gemma 4 target, not {target.model_type}")
    sources = target_sources(target)
    for i in range(layer.num_layers):
        kind = SLIDING if layer.is_sliding(i) else FULL
        src = sources[0] if kind == SLIDING else sources[1]
        if src < 0:
            raise SourceError(f"{where}: its layer {i} reads the target's {kind} cache, and the target has no "
                              f"{kind} layer with a cache")
        if layer.kv_shape_of(i) != target.kv_shape_of(src):
            raise SourceError(f"{where}: its layer {i} ({kind}) has {layer.kv_heads_of(i)} KV heads of size "
                              f"{layer.head_dim_of(i)}, the target layer {src} it reads has {target.kv_heads_of(src)} "
                              f"of size {target.head_dim_of(src)}")
        if kind == SLIDING and layer.sliding_window != target.sliding_window:
            raise SourceError(f"{where}: its sliding window is {layer.sliding_window}, the target's "
                              f"{target.sliding_window}")
    ordered = bool(hf.get("use_ordered_embeddings", False))
    centroids, top_k = int(hf.get("num_centroids", 2048)), int(hf.get("centroid_intermediate_top_k", 32))
    if ordered and not (1 <= top_k <= centroids and layer.vocab_size % centroids == 0):
        raise SourceError(f"{where}: num_centroids {centroids} must divide the vocabulary ({layer.vocab_size}) and "
                          f"centroid_intermediate_top_k {top_k} be between 1 and it")
    return AssistantConfig(layer, backbone, ordered, centroids, top_k, sources)


def expected_shapes(cfg: AssistantConfig) -> dict[str, tuple[int, ...]]:
    """The assistant checkpoint's tensors and their shapes (lm_head is tied to model.embed_tokens)."""
    c, h, b = cfg.layer, cfg.layer.hidden_size, cfg.backbone_hidden_size
    want = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,),
            "pre_projection.weight": (h, 2 * b), "post_projection.weight": (b, h)}
    for i in range(c.num_layers):
        p, d = f"model.layers.{i}.", c.head_dim_of(i)
        want.update({p + "self_attn.q_proj.weight": (c.num_heads * d, h), p + "self_attn.q_norm.weight": (d,),
                     p + "self_attn.o_proj.weight": (h, c.num_heads * d), p + "mlp.gate_proj.weight": (c.intermediate_size, h),
                     p + "mlp.up_proj.weight": (c.intermediate_size, h), p + "mlp.down_proj.weight": (h, c.intermediate_size),
                     p + "layer_scalar": (1,)})
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            want[p + norm + ".weight"] = (h,)
    if cfg.ordered_embeddings:
        want["masked_embedding.centroids.weight"] = (cfg.num_centroids, h)
        want["masked_embedding.token_ordering"] = (c.vocab_size,)
    return want


class Gemma4Assistant(nn.Module):
    """The assistant in HF's names (model.*, pre_projection, post_projection, masked_embedding.*)."""

    def __init__(self, cfg: AssistantConfig, target_norm_eps: float):
        super().__init__()
        from specrt.models.gemma4 import Gemma4Block

        c = cfg.layer
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.model.layers = nn.ModuleList(Gemma4Block(c, i) for i in range(c.num_layers))
        self.model.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, 0.0)
        self.pre_projection = nn.Linear(2 * cfg.backbone_hidden_size, c.hidden_size, bias=False)
        self.post_projection = nn.Linear(c.hidden_size, cfg.backbone_hidden_size, bias=False)
        self.target_norm = RMSNorm(cfg.backbone_hidden_size, target_norm_eps, 0.0)  # the target's final norm
        if cfg.ordered_embeddings:
            self.masked_embedding = nn.Module()
            self.masked_embedding.centroids = nn.Linear(c.hidden_size, cfg.num_centroids, bias=False)
            self.masked_embedding.register_buffer("token_ordering", torch.zeros(c.vocab_size, dtype=torch.long))

    def forward(self, embedded: torch.Tensor, features: torch.Tensor | None, hidden: torch.Tensor | None,
                position_ids: torch.Tensor, caches: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        """embedded: the target's scaled embeddings of the tokens [1, S, B]; features: the target's residual stream
        after its last layer [1, S, B] (first step), else hidden: the previous step's hidden_out [1, S, B];
        caches: per target layer read, its committed (keys, values) [1, KV, T, D] (sliding: the window's slots).
        Returns logits [1, S, V] and hidden_out [1, S, B]."""
        h = self.target_norm(features) if features is not None else hidden
        x = self.pre_projection(torch.cat((embedded, h), dim=-1))
        for i, block in enumerate(self.model.layers):
            keys, values = caches[self.cfg.source_of(i)]
            mask = torch.zeros(1, 1, x.shape[1], keys.shape[2])
            x, _, _ = block(x, position_ids, None, None, mask, shared=(keys, values))
        y = self.model.norm(x)
        return self.head(y), self.post_projection(y)

    def head(self, y: torch.Tensor) -> torch.Tensor:
        """[1, S, h] -> logits [1, S, V]: the tied table, or only the top centroids' tokens (ordered embeddings)."""
        table = self.model.embed_tokens.weight
        if not self.cfg.ordered_embeddings:
            return y @ table.T
        cfg = self.cfg
        per = cfg.vocab_size // cfg.num_centroids
        top = torch.topk(self.masked_embedding.centroids(y), cfg.centroid_top_k, dim=-1).indices  # [1, S, k]
        ids = self.masked_embedding.token_ordering.view(cfg.num_centroids, per)[top].flatten(-2)  # [1, S, k * per]
        picked = (y.unsqueeze(-2) @ table[ids].transpose(-1, -2)).squeeze(-2)  # [1, S, k * per]
        out = (picked.min(dim=-1, keepdim=True).values - 1.0).expand(*y.shape[:-1], cfg.vocab_size).clone()
        return out.scatter(-1, ids, picked)


def scaled_embedding(table: torch.Tensor, tokens: torch.Tensor, backbone: int) -> torch.Tensor:
    """The target's token embeddings times sqrt(B), as the target scales its own."""
    return table[tokens] * torch.tensor(math.sqrt(backbone), dtype=table.dtype)
