"""Write a GGUF model as an HF folder (config.json + model.safetensors + tokenizer) for the benchmarks.

onnxruntime-genai's model builder and optimum read HF folders; this gives them exactly the weights
specrt converts (dequantized from the same GGUF). Usage:
    python scripts/gguf_to_hf.py MODEL.gguf BUNDLE_DIR OUT_DIR
(BUNDLE_DIR supplies the tokenizer files that specrt convert extracted.)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from specrt.models.gguf_loader import load_gguf

ARCH_CLASS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def main(gguf_path: str, bundle: str, out: str) -> None:
    hf, weights, _ = load_gguf(Path(gguf_path))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if hf.get("tie_word_embeddings"):
        weights.pop("lm_head.weight", None)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}, str(out_dir / "model.safetensors"))
    config = {**hf, "architectures": [ARCH_CLASS[hf["model_type"]]], "torch_dtype": "float32",
              "hidden_act": hf.get("hidden_act", "silu")}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"bos_token_id": hf.get("bos_token_id"), "eos_token_id": hf.get("eos_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(gen))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (Path(bundle) / name).is_file():
            shutil.copyfile(Path(bundle) / name, out_dir / name)
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
