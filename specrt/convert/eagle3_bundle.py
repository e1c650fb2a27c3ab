"""`specrt convert TARGET --drafter eagle3:PATH`: an EAGLE-3 checkpoint (vLLM/SGLang layout) into the bundle.

The checkpoint is checked against the target (hidden size, vocabulary, layer ids, tensor names and shapes,
d2t range), exported to eagle3.onnx with its own KV cache (convert/eagle3_graph.py; int4 or int8 beside a target of
that precision, else fp32), validated against the torch head, and its d2t map written beside it as
eagle3.d2t.safetensors. The target graph then emits the hidden states of the head's three layers (the pipeline asks
`hidden_layers_for` before building it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from specrt.bundle import KVLayout, TargetGraph, checkpoint_sha256
STEM = "eagle3"


def check(arg: str, precision: str) -> None:
    """Nothing to refuse before work starts beyond the checkpoint folder (convert/drafter_bundle.py checks it)."""


def stages(arg: str) -> int:
    return 2  # build, validate


def hidden_layers_for(arg: str, loaded) -> tuple[int, ...]:
    """The target layers the head reads (its config's aux layer ids, or EAGLE's default)."""
    from specrt.models.eagle3 import load_eagle3_checkpoint

    cfg, _ = load_eagle3_checkpoint(Path(arg).expanduser(), loaded.config)
    return cfg.aux_layers


def add(spec: str, arg: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages,
        build_graph=None, *, device: str = "cpu") -> dict:
    """Write the head's graph and d2t into tmp; returns its manifest entry."""
    from safetensors.numpy import save_file

    from specrt.convert.eagle3_graph import _Eagle3Builder, _graph_weights
    from specrt.convert.gpu_profile import activation_dtype
    from specrt.convert.head_graph import export_head, head_precision
    from specrt.convert.target_graph import GraphOptions
    from specrt.models.eagle3 import load_eagle3_checkpoint, model_from_tensors

    cfg, tensors = load_eagle3_checkpoint(Path(arg).expanduser(), loaded.config)
    embed = np.asarray(loaded.weights["model.embed_tokens.weight"], dtype=np.float32)
    opts = GraphOptions(precision=head_precision(precision), max_context=max_context, device=device)
    builder = _Eagle3Builder(cfg, _graph_weights(tensors, embed), opts)
    inputs, validation = export_head(builder, model_from_tensors(cfg, tensors), embed,
                               lambda name: name.replace("model.layers.0.", "midlayer."), tmp, STEM, providers,
                               stages, "EAGLE-3")
    save_file({"d2t": np.ascontiguousarray(tensors["d2t"].astype(np.int64))}, str(tmp / f"{STEM}.d2t.safetensors"))
    c = cfg.layer
    graph = TargetGraph(file=f"{STEM}.onnx", data_file=f"{STEM}.onnx.data", precision=opts.precision, inputs=inputs,
                        outputs=("logits", "hidden_out"), hidden_size=c.hidden_size)
    kv = KVLayout(layers=1, kv_heads=c.num_kv_heads, head_dim=c.head_dim, max_context=max_context,
                  dtype=activation_dtype(opts.precision, device))
    return {
        "kind": "eagle3", "name": "eagle3", "spec": spec, "source": str(Path(arg).expanduser()),
        "source_sha256": checkpoint_sha256(Path(arg).expanduser()),  # what a cached catalog bundle compares
        "model_config": c.to_dict(), "graph": dataclasses.asdict(graph), "kv": dataclasses.asdict(kv),
        "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size, "aux_layers": list(cfg.aux_layers),
        "target_hidden_size": cfg.target_hidden_size, "extra_files": [f"{STEM}.d2t.safetensors"],
        "validation": validation,
    }
