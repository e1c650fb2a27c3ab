"""The source model as the compared systems read it: the GGUF itself (llama.cpp) or an HF folder
(onnxruntime-genai's builder, transformers, optimum) holding exactly the weights specrt converts, dequantized
from the same GGUF. Folders are written once into the cache, under a temporary name renamed when complete."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from specrt.bundle import sha256_file
from specrt.catalog import cache_dir
from specrt.app.compare.environment import SystemUnavailable
from specrt import archs

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def hf_folder(source: Path, kind: str, bundle: Path, log, sha256: str | None = None) -> Path:
    """An HF folder for source: itself when it is one; for a GGUF, one written from it into the cache."""
    if kind != "gguf":
        return source
    digest = (sha256 or sha256_file(source))[:16]
    out = cache_dir() / "systems" / "models" / digest / "hf"
    if (out / "config.json").is_file():
        return out
    log(f"writing an HF folder from {source.name} for the compared systems")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".hf-") as tmp:
        write_hf_folder(source, bundle, Path(tmp) / "hf")
        os.replace(Path(tmp) / "hf", out)
    return out


def write_hf_folder(gguf: Path, bundle: Path, out: Path) -> None:
    """config.json + model.safetensors (float32) + the tokenizer files specrt convert put in the bundle."""
    import numpy as np
    from safetensors.numpy import save_file

    from specrt.models.gguf_loader import load_gguf

    hf, weights, _ = load_gguf(gguf)
    hf_class = archs.hf_class(hf["model_type"])
    if not hf_class:
        raise SystemUnavailable(f"no HF class known for model type {hf['model_type']!r}")
    out.mkdir(parents=True)
    tied = hf.get("tie_word_embeddings")
    save_file({k: np.ascontiguousarray(weights[k], dtype=np.float32) for k in weights
               if not (tied and k == "lm_head.weight")}, str(out / "model.safetensors"))
    config = {**hf, "architectures": [hf_class], "torch_dtype": "float32",
              "hidden_act": hf.get("hidden_act", "silu")}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"bos_token_id": hf.get("bos_token_id"), "eos_token_id": hf.get("eos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(gen))
    for name in TOKENIZER_FILES:
        if (bundle / name).is_file():
            shutil.copyfile(bundle / name, out / name)


def gguf_quant_label(gguf: Path) -> str:
    """The GGUF's weight format as llama.cpp names it ("Q4_1", "Q4_K_M", "F16"...)."""
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(str(gguf))
    field = reader.fields.get("general.file_type")
    if field is None:
        return "gguf"
    name = LlamaFileType(int(field.parts[field.data[0]][0])).name
    return name.removeprefix("MOSTLY_")
