"""Run one conversion path under a memory limit, in its own process (tests/test_streaming_convert.py).

`python tests/memory_limited_convert.py new|old SOURCE OUT BUDGET_MB` imports everything either path needs,
then limits the process's data memory (RLIMIT_DATA: heap and private anonymous mappings) to what it uses now
plus BUDGET_MB and converts SOURCE to int4: "new" with `specrt convert`'s streaming pipeline (validation
included), "old" with the in-memory path (graph only). Prints "converted" and exits 0 when it fit.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np
import onnx  # noqa: F401  (imported before the limit: both paths need it)
import onnxruntime  # noqa: F401
import tokenizers  # noqa: F401
import torch  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def data_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def write_mid_model(folder: Path, layers: int = 12, hidden: int = 512, intermediate: int = 1536) -> int:
    """An HF llama folder of about 38M random parameters (150 MB as float32) with the tiny tokenizer."""
    from safetensors.numpy import save_file

    from tests.tiny_models import save_tiny_tokenizer

    heads, kv_heads, head_dim, vocab = 8, 4, 64, 97
    folder.mkdir(parents=True)
    cfg = dict(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
               num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
               max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
               hidden_act="silu", bos_token_id=1, eos_token_id=2)
    (folder / "config.json").write_text(json.dumps(cfg))
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                       p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                       p + "mlp.gate_proj.weight": (intermediate, hidden), p + "mlp.up_proj.weight": (intermediate, hidden),
                       p + "mlp.down_proj.weight": (hidden, intermediate),
                       p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)})
    rng = np.random.default_rng(0)
    tensors = {name: (rng.standard_normal(s, dtype=np.float32) * 0.02 if len(s) == 2
                      else 1.0 + 0.1 * rng.standard_normal(s, dtype=np.float32)) for name, s in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    save_tiny_tokenizer(folder)
    return sum(t.size for t in tensors.values())


def main(mode: str, source: str, out: str, budget_mb: int) -> None:
    from specrt.convert import pipeline, sources
    from specrt.convert.target_graph import GraphOptions
    from tests.inmemory_convert import write_graph_in_memory

    resource.setrlimit(resource.RLIMIT_DATA, (data_bytes() + budget_mb * (1 << 20),) * 2)
    if mode == "new":
        pipeline.convert(source, Path(out), pipeline.ConvertOptions(precision="int4", max_context=64))
    else:
        loaded = sources.load(sources.resolve(source))
        Path(out).mkdir()
        write_graph_in_memory(loaded.config, loaded.weights.materialize(),
                              GraphOptions(precision="int4", max_context=64), [[1, 2, 3, 4, 5]] * 4, Path(out))
    print("converted")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
