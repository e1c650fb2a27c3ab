"""The one registry of target architectures: for each, the HF model_types and llama.cpp architectures it reads,
and the module under specrt/archs/ that holds everything peculiar to it.

Nothing outside specrt/archs/ compares against an architecture's name (tests/architecture_rules.py checks it):
the pipeline asks this registry for the architecture of a config or a GGUF file and calls the hooks its module
defines. The registry imports only the standard library; a module is imported when first used.

A module under specrt/archs/ defines (the hooks marked optional fall back to the Llama layout):
- `config_from_hf(hf: dict) -> ModelConfig`: its config (models/config.py's readers do the common fields);
- `gguf_config(gguf) -> dict` (optional): an HF-style config from GGUF metadata (default: the common keys), and
  `gguf_fixups(gguf, hf)` (optional) for what llama.cpp fixes by the architecture;
- `GGUF_BLOCK_TENSORS` (optional): llama.cpp's per-block tensor names -> HF names, and `gguf_undo(hf_name, hf)`
  (optional): how a tensor was changed by llama.cpp's converter, undone; `gguf_refs(gguf, hf)` (optional) reads a
  file whose tensors need more than a renaming;
- `hf_refs(refs, hf)` and `gguf_split(refs, hf)` (optional): a folder's or a GGUF file's tensors with the fused
  ones (experts, Phi-3's qkv) split into the parts the Llama layout names;
- `torch_block(cfg, layer)`: the torch module of one decoder layer (models/);
- `graph_qkv(builder, layer, h)` and `graph_layer_rest(builder, layer, x, attn, ple)` (optional): its layers in the
  ONNX graph where they differ from the Llama layout (convert/target_graph.py);
- `layer_shapes(cfg, layer)` and `check_weights(cfg, weights, where)` (optional): the tensors a layer must have.

Adding an architecture: one module here and one entry below (docs/adding-an-architecture.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from specrt.errors import SourceError


@dataclass(frozen=True)
class Arch:
    name: str  # its module: specrt/archs/<name>.py
    hf_classes: dict[str, str]  # HF model_type -> the transformers class of a causal LM of that type ("" if none)
    multimodal: dict[str, str] = field(default_factory=dict)  # published multimodal model_type -> its text_config's
    gguf: dict[str, str] = field(default_factory=dict)  # llama.cpp general.architecture -> HF model_type
    mtp_sources: tuple[str, ...] = ()  # source kinds an MTP module is read from (its own checkpoint or GGUF)
    assistant: bool = False  # Gemma 4's assistant drafts for it
    title: str = ""  # what users call it (README's table)

    @property
    def model_types(self) -> tuple[str, ...]:
        return (*self.hf_classes, *self.multimodal)

    def module(self):
        """specrt.archs.<name> (imported on first use)."""
        return importlib.import_module(f"specrt.archs.{self.name}")

    def hook(self, name: str, default=None):
        """The module's hook `name`, or `default` where it has none."""
        return getattr(self.module(), name, default)


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"},
         gguf={"llama": "llama", "mistral": "mistral"}, mtp_sources=("hf",), title="Llama 2/3, Mistral, SmolLM2"),
    Arch("qwen2", {"qwen2": "Qwen2ForCausalLM", "mimo": ""}, gguf={"qwen2": "qwen2"}, mtp_sources=("hf",),
         title="Qwen2/2.5, MiMo"),
    Arch("qwen3", {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"},
         gguf={"qwen3": "qwen3", "qwen3moe": "qwen3_moe"}, mtp_sources=("hf",), title="Qwen3, Qwen3-MoE"),
    Arch("gpt_oss", {"gpt_oss": "GptOssForCausalLM"}, gguf={"gpt-oss": "gpt_oss"}, mtp_sources=("hf",),
         title="gpt-oss"),
    Arch("gemma3", {"gemma3_text": "Gemma3ForCausalLM"}, multimodal={"gemma3": "gemma3_text"},
         gguf={"gemma3": "gemma3_text"}, title="Gemma 3"),
    Arch("gemma4", {"gemma4_text": "Gemma4ForCausalLM"}, multimodal={"gemma4": "gemma4_text"},
         gguf={"gemma4": "gemma4_text"}, assistant=True, title="Gemma 4"),
    Arch("phi3", {"phi3": "Phi3ForCausalLM"}, gguf={"phi3": "phi3"}, title="Phi-3.5-mini, Phi-4-mini"),
    Arch("lfm2", {"lfm2": "Lfm2ForCausalLM"}, gguf={"lfm2": "lfm2"}, title="LFM2, LFM2.5"),
    Arch("smollm3", {"smollm3": "SmolLM3ForCausalLM"}, gguf={"smollm3": "smollm3"}, title="SmolLM3"),
    Arch("qwen3_5", {"qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"},
         multimodal={"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"},
         gguf={"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}, mtp_sources=("hf", "gguf"),
         title="Qwen3.5 / 3.6 (dense and MoE)"),
)}

BY_MODEL_TYPE = {t: a for a in ARCHS.values() for t in a.model_types}
BY_GGUF = {g: a for a in ARCHS.values() for g in a.gguf}


def names() -> set[str]:
    """Every name the registry knows (architectures, model_types, GGUF architectures): what no code outside
    specrt/archs/ may compare against."""
    return {*ARCHS, *BY_MODEL_TYPE, *BY_GGUF}


def for_model_type(model_type: str) -> Arch:
    """The architecture reading an HF model_type (a SourceError listing the supported ones otherwise)."""
    arch = BY_MODEL_TYPE.get(model_type)
    if arch is None:
        raise SourceError(f"unsupported architecture {model_type!r} (supported: {', '.join(sorted(BY_MODEL_TYPE))})")
    return arch


def of(config) -> Arch:
    """The architecture of a ModelConfig (by its model_type)."""
    return for_model_type(config.model_type)


def for_gguf(name) -> Arch:
    """The architecture reading a GGUF file whose general.architecture is `name`."""
    arch = BY_GGUF.get(name) if isinstance(name, str) else None
    if arch is None:
        raise SourceError(f"unsupported GGUF architecture {name!r} (supported: {', '.join(BY_GGUF)})")
    return arch


def hf_class(model_type: str) -> str:
    """The transformers class of a causal LM of this model_type ("" where transformers has none)."""
    arch = BY_MODEL_TYPE.get(model_type)
    return arch.hf_classes.get(model_type, "") if arch else ""
