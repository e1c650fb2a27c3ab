"""SmolLM3 (SmolLM3-3B): Llama blocks whose every fourth layer has no rotary embeddings (NoPE: no_rope_layers, or
every no_rope_layer_interval-th layer); tied embeddings. llama.cpp writes no NoPE key and skips rotary on every
fourth layer (n_no_rope_layer_step = 4), which is the default read here; its q/k rows are permuted as Llama's."""

from __future__ import annotations

from specrt.archs import llama
from specrt.errors import SourceError
from specrt.models.config import ModelConfig, dense_config, sizes


def config_from_hf(hf: dict) -> ModelConfig:
    layers = sizes(hf)[2]
    flags = hf.get("no_rope_layers")  # per layer: 1 turns its queries and keys, 0 does not
    if flags is None:
        interval = int(hf.get("no_rope_layer_interval") or 4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) < layers or any(f not in (0, 1) for f in flags[:layers]):
        raise SourceError(f"config: no_rope_layers must give a 0 or 1 for each of the {layers} layers")
    return dense_config(hf, tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
                        nope_layers=tuple(not f for f in flags[:layers]))


def torch_block(cfg: ModelConfig, layer: int):
    from specrt.models.transformer import LlamaBlock

    return LlamaBlock(cfg, layer)


gguf_undo = llama.gguf_undo  # llama.cpp permuted the q/k rows as Llama's: undone the same way
