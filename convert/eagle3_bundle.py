"""`specrt convert TARGET --drafter eagle3:PATH`: an EAGLE-3 checkpoint (vLLM/SGLang layout) into the bundle.

The checkpoint is checked against the target (hidden size, vocabulary, layer ids, tensor names and shapes,
d2t range), exported to eagle3.onnx with its own KV cache (convert/eagle3_graph.py), validated against the torch
head, and its d2t map written beside it as eagle3.d2t.safetensors. The target graph then emits the hidden
states of the head's three layers (the pipeline asks `hidden_layers_for` before building it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from specrt.bundle import KVLayout, TargetGraph
from specrt.errors import ValidationError

STEM = "eagle3"
MAX_DIFF = 1e-3


def hidden_layers_for(arg: str, target_cfg) -> tuple[int, ...]:
    """The target layers the head reads (its config's aux layer ids, or EAGLE's default)."""
    from specrt.models.eagle3 import load_eagle3_checkpoint

    cfg, _ = load_eagle3_checkpoint(Path(arg).expanduser(), target_cfg)
    return cfg.aux_layers


def add_eagle3(spec: str, arg: str, tmp: Path, loaded, max_context: int, providers, stages) -> dict:
    import onnx
    import onnxruntime as ort
    from safetensors.numpy import save_file

    from specrt.convert.eagle3_graph import build_eagle3_graph
    from specrt.convert.head_graph import compare_with_torch
    from specrt.convert.target_graph import GraphOptions
    from specrt.models.eagle3 import load_eagle3_checkpoint, model_from_tensors

    stages.start("build eagle3 graph")
    cfg, tensors = load_eagle3_checkpoint(Path(arg).expanduser(), loaded.config)
    embed = loaded.weights["model.embed_tokens.weight"].astype(np.float32)
    model = build_eagle3_graph(cfg, tensors, embed, GraphOptions(precision="fp32", max_context=max_context))
    onnx.save_model(model, str(tmp / f"{STEM}.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{STEM}.onnx.data", size_threshold=1024)
    save_file({"d2t": np.ascontiguousarray(tensors["d2t"].astype(np.int64))}, str(tmp / f"{STEM}.d2t.safetensors"))
    stages.done()
    stages.start("validate eagle3")
    session = ort.InferenceSession(str(tmp / f"{STEM}.onnx"), providers=list(providers))
    diff = compare_with_torch(session, model_from_tensors(cfg, tensors), embed)
    if diff > MAX_DIFF:
        raise ValidationError(f"EAGLE-3 graph differs from its torch definition by {diff:.2e} (limit {MAX_DIFF})")
    stages.done()
    c = cfg.layer
    graph = TargetGraph(file=f"{STEM}.onnx", data_file=f"{STEM}.onnx.data", precision="fp32",
                        inputs=tuple(i.name for i in session.get_inputs() if not i.name.startswith("past_")),
                        outputs=("logits", "hidden_out"), hidden_size=c.hidden_size)
    kv = KVLayout(layers=1, kv_heads=c.num_kv_heads, head_dim=c.head_dim, max_context=max_context, dtype="float32")
    return {
        "kind": "eagle3", "name": "eagle3", "spec": spec, "source": str(Path(arg).expanduser()),
        "model_config": c.to_dict(), "graph": dataclasses.asdict(graph), "kv": dataclasses.asdict(kv),
        "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size, "aux_layers": list(cfg.aux_layers),
        "target_hidden_size": cfg.target_hidden_size, "extra_files": [f"{STEM}.d2t.safetensors"],
        "validation": {"max_abs_diff": diff},
    }
