"""The torch reference run one layer at a time: each layer's weights are in memory only while it runs.

Conversion needs the reference model's outputs (logits and hidden-state taps, to validate the ONNX graph) and,
for int4, the largest input of every down projection (to smooth it). Running every prompt through layer 0,
then every prompt through layer 1, and so on, computes exactly what the whole model would (the same modules on
the same inputs) while holding one layer's float32 weights and the prompts' activations, never the model: peak
memory does not grow with the number of layers.

A mixture of experts' reference can follow another implementation's choice of experts (`routes`, the ONNX graph's,
for validation): where two experts nearly tie, each side's rounding may pick either, and the reference takes the
graph's pick where it is such a near-tie (models/moe.py ExpertChoice); `Reference.routing` counts the picks it
followed and lists any that were not near-ties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from specrt.models.config import ModelConfig
from specrt.models.moe import ROUTE_TIE, ExpertChoice
from specrt.models.tensor_source import rows_of, shape_of
from specrt.models.transformer import RMSNorm, block as layer_block, causal_mask


@dataclass
class RoutesFollowed:
    followed: int = 0  # token-layers where the given choice differs from the reference's own top k (near-ties)
    refused: list[tuple[int, int, int, float]] = field(default_factory=list)  # (layer, prompt, position, gap)
    tokens: int = 0  # token-layers routed


@dataclass
class Reference:
    logits: list[np.ndarray] = field(default_factory=list)  # per prompt: [S, V] float32
    taps: list[np.ndarray | None] = field(default_factory=list)  # per prompt: [S, len(hidden_layers) * H]
    down_proj_max: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [intermediate] max |input|
    routing: RoutesFollowed | None = None  # with `routes`: what following the given choice of experts took


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.require(array, np.float32, requirements="W"))


def load_module(module: torch.nn.Module, weights: Mapping, prefix: str) -> torch.nn.Module:
    """Give a module built on the meta device the weights named prefix + its parameter names (reading only
    those); parameters the weights lack keep their default initialization, as the whole-model reference does."""
    module.to_empty(device="cpu")
    state = {k[len(prefix):]: _tensor(weights[k]) for k in weights if k.startswith(prefix)}
    module.load_state_dict(state, strict=False, assign=True)
    for name, sub in module.named_modules():
        if hasattr(sub, "rotary_frequencies"):
            sub.inv_freq = sub.rotary_frequencies()
        lacking = [n for n, _ in sub.named_parameters(recurse=False) if f"{name}.{n}".lstrip(".") not in state]
        if not lacking:
            continue
        if isinstance(sub, RMSNorm):
            torch.nn.init.constant_(sub.weight, 0.0 if sub.offset else 1.0)
        else:
            sub.reset_parameters()
    return module.eval().requires_grad_(False)


def run_layerwise(cfg: ModelConfig, weights: Mapping, prompts: list[list[int]], hidden_layers=(),
                  observe: int = 0, outputs_from: int = 0, routes: list[dict[int, np.ndarray]] | None = None,
                  route_tie: float = ROUTE_TIE) -> Reference:
    """The reference outputs for each prompt (batch 1, no past), computed layer by layer.

    weights: HF-named float arrays (read when used; a LazyWeights reads each from disk). A tap for layer i is
    the residual stream after layer i. observe: the first `observe` prompts also record every down
    projection's largest input per channel (int4 calibration). Logits and taps are returned for
    prompts[outputs_from:] only (a [S, V] array per prompt is large with a 150k vocabulary). routes: per prompt of
    prompts[outputs_from:], MoE layer -> the expert ids [S, k] to follow where they are near-ties (within route_tie
    of the row's spread)."""
    out = Reference(routing=RoutesFollowed() if routes is not None else None)
    with torch.no_grad():
        # per prompt [1, S, H]: only the prompts' rows of the embedding table are read
        xs = [_tensor(rows_of(weights, "model.embed_tokens.weight", np.asarray(ids)))[None] for ids in prompts]
        if cfg.embed_scale != 1.0:
            xs = [x * torch.tensor(cfg.embed_scale, dtype=x.dtype) for x in xs]
        positions = [torch.arange(len(ids))[None] for ids in prompts]
        ple = per_layer_inputs(cfg, weights, prompts, xs) if cfg.ple_size else None
        # Gemma 4: the layers whose caches later layers read, and each prompt's keys and values of them
        read_later = {cfg.kv_source(j) for j in range(cfg.num_layers) if cfg.kv_source(j) != j}
        kept: list[dict[int, tuple]] = [{} for _ in prompts]
        taps: list[list[torch.Tensor]] = [[] for _ in prompts]
        for i in range(cfg.num_layers):
            with torch.device("meta"):
                block = layer_block(cfg, i)
            block = load_module(block, weights, f"model.layers.{i}.")
            empty = torch.zeros(1, cfg.kv_heads_of(i), 0, cfg.head_dim_of(i))
            source = cfg.kv_source(i)
            for p, (x, pos) in enumerate(zip(xs, positions)):
                hook = None
                if p < observe and hasattr(block.mlp, "down_proj"):  # a dense MLP (experts are not smoothed)
                    hook = block.mlp.down_proj.register_forward_hook(_recorder(out.down_proj_max, i))
                extra = {}
                if ple is not None:
                    extra["per_layer_input"] = ple[p][:, :, i]
                if source != i:
                    extra["shared"] = kept[p][source]
                choice = _follow(block, i, routes[p - outputs_from], route_tie) if routes and p >= outputs_from else None
                xs[p], k, v = block(x, pos, empty, empty, causal_mask(cfg, i, pos, 0), **extra)
                if choice is not None:
                    _count(out.routing, choice, i, p - outputs_from, x.shape[1])
                if i in read_later:
                    kept[p][i] = (k, v)
                if hook is not None:
                    hook.remove()
                if i in hidden_layers and p >= outputs_from:
                    taps[p].append(xs[p])
            del block
        with torch.device("meta"):
            norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        norm = load_module(norm, weights, "model.norm.")
        head_name = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        normed = [norm(x)[0] for x in xs[outputs_from:]]  # per prompt [S, H]
        out.logits = head_logits(weights, head_name, normed)
        if cfg.final_softcap:  # Gemma: cap * tanh(logits / cap)
            for logits in out.logits:
                np.multiply(np.tanh(logits / cfg.final_softcap), cfg.final_softcap, out=logits)
        out.taps = [torch.cat(tap, dim=-1)[0].numpy() if tap else None for tap in taps[outputs_from:]]
    return out


def _follow(block: torch.nn.Module, layer: int, routes: dict[int, np.ndarray], tie: float) -> ExpertChoice | None:
    """Set the block's router to follow routes[layer] [S, k] (None when the layer has no experts)."""
    choice = next((m.choice for m in block.modules() if isinstance(getattr(m, "choice", None), ExpertChoice)), None)
    if choice is None:
        if layer in routes:
            raise ValueError(f"routes given for layer {layer}, which has no experts")
        return None
    if layer not in routes:
        raise ValueError(f"no routes given for MoE layer {layer}")
    choice.follow, choice.followed, choice.refused = torch.from_numpy(np.asarray(routes[layer])), 0, []
    choice.tie = tie
    return choice


def _count(record: RoutesFollowed, choice: ExpertChoice, layer: int, prompt: int, tokens: int) -> None:
    if choice.follow is not None:
        raise RuntimeError(f"layer {layer}'s router did not take the routes it was given")
    record.followed += choice.followed
    record.refused += [(layer, prompt, t, gap) for t, gap in choice.refused]
    record.tokens += tokens


def per_layer_inputs(cfg: ModelConfig, weights: Mapping, prompts: list[list[int]], xs: list[torch.Tensor]):
    """Gemma 4's per-layer inputs of each prompt [1, S, L, P] from its scaled embeddings xs [1, S, H] (reading only
    the prompts' rows of the per-layer table)."""
    from specrt.models.gemma4 import per_layer_inputs as combine

    with torch.device("meta"):
        norm = RMSNorm(cfg.ple_size, cfg.rms_norm_eps, 0.0)
    norm = load_module(norm, weights, "model.per_layer_projection_norm.")
    projection = _tensor(weights["model.per_layer_model_projection.weight"])
    return [combine(cfg, _tensor(rows_of(weights, "model.embed_tokens_per_layer.weight", np.asarray(ids)))[None],
                    x, projection, norm) for ids, x in zip(prompts, xs)]


HEAD_ROWS = 16384  # output-head rows read at a time (a 248k x 4096 head would be 4 GB of float32 at once)


def head_logits(weights: Mapping, name: str, xs: list[torch.Tensor]) -> list[np.ndarray]:
    """Per x [S, H], the logits x @ head.T [S, V] for the head matrix `name` [V, H] of weights, reading the head
    HEAD_ROWS rows at a time (only where the mapping can read rows; otherwise whole)."""
    vocab = shape_of(weights, name)[0]
    logits = [np.empty((x.shape[0], vocab), dtype=np.float32) for x in xs]
    for lo in range(0, vocab, HEAD_ROWS):
        rows = np.arange(lo, min(lo + HEAD_ROWS, vocab))
        head = _tensor(rows_of(weights, name, rows))  # [rows, H]
        for out, x in zip(logits, xs):
            out[:, rows[0]:rows[-1] + 1] = torch.nn.functional.linear(x, head).numpy()
    return logits


def _recorder(stats: dict[int, np.ndarray], layer: int):
    def hook(_module, inputs, _output):
        m = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0).numpy()
        stats[layer] = np.maximum(stats[layer], m) if layer in stats else m
    return hook
