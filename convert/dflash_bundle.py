"""`specrt convert TARGET --drafter dflash:FOLDER`: a DFlash checkpoint (reference layout, models/dflash.py)
into the bundle as dflash.onnx (convert/dflash_graph.py), validated against the torch drafter. The target graph
then emits the hidden states of the drafter's layers (the pipeline asks `hidden_layers_for` first).

The drafter runs in fp32 beside every target precision (its graph is exported from torch, without specrt's
int4 quantizer); its block size is capped by the target graph's context. A checkpoint with a draft vocabulary
(d2t, models/dflash.py) keeps only those rows of the target's lm_head, and its d2t goes beside the graph as
dflash.d2t.safetensors (the EAGLE-3 head's format).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle import checkpoint_sha256
from specrt.errors import SourceError, ValidationError

STEM = "dflash"
MAX_DIFF = 1e-3


def check(arg: str, precision: str) -> None:
    """Nothing to refuse before work starts beyond the checkpoint folder (convert/drafter_bundle.py checks it)."""


def stages(arg: str) -> int:
    return 2  # build, validate


def hidden_layers_for(arg: str, loaded) -> tuple[int, ...]:
    """The target layers the drafter reads (its config's target_layer_ids)."""
    from specrt.models.dflash import load_dflash_checkpoint

    cfg, _ = load_dflash_checkpoint(Path(arg).expanduser(), loaded.config)
    return cfg.target_layer_ids


def add(spec: str, arg: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages,
        build_graph=None) -> dict:
    """Write the drafter's graph (and d2t) into tmp; returns its manifest entry."""
    import onnxruntime as ort

    from safetensors.numpy import save_file

    from specrt.convert.dflash_graph import DFlashGraphModule, compare_with_torch, export_dflash_graph
    from specrt.models.dflash import D2T, load_dflash_checkpoint, model_from_tensors

    folder = Path(arg).expanduser()
    cfg, tensors = load_dflash_checkpoint(folder, loaded.config)
    if cfg.block_size >= max_context:
        raise SourceError(f"DFlash block size {cfg.block_size} does not fit the target graph's context of "
                          f"{max_context} tokens (convert with a larger --max-context)")
    embed = loaded.weights["model.embed_tokens.weight"].astype(np.float32)
    head = loaded.weights.get("lm_head.weight")
    lm_head = embed if head is None or loaded.config.tie_word_embeddings else head.astype(np.float32)
    extra = {}
    if D2T in tensors:  # a draft vocabulary: those rows of the lm_head only
        d2t = tensors[D2T]
        lm_head = lm_head[np.arange(len(d2t)) + d2t]  # [V_draft, H]
        save_file({"d2t": np.ascontiguousarray(d2t)}, str(tmp / f"{STEM}.d2t.safetensors"))
        extra = {"draft_vocab_size": len(d2t), "extra_files": [f"{STEM}.d2t.safetensors"]}
    module = DFlashGraphModule(model_from_tensors(cfg, tensors), embed, lm_head)  # raw embeddings, as the reference
    stages.start(f"build {STEM} graph")
    export_dflash_graph(module, tmp / f"{STEM}.onnx")
    stages.done()
    stages.start(f"validate {STEM}")
    session = ort.InferenceSession(str(tmp / f"{STEM}.onnx"), providers=list(providers))
    diff = compare_with_torch(session, module)
    if diff > MAX_DIFF:
        raise ValidationError(f"DFlash graph differs from its torch definition by {diff:.2e} (limit {MAX_DIFF})")
    stages.done()
    c = cfg.layers
    return {
        "kind": "dflash", "name": "dflash", "spec": spec, "source": str(folder), "source_sha256": checkpoint_sha256(folder),
        "model_config": c.to_dict(),
        "graph": {"file": f"{STEM}.onnx", "data_file": f"{STEM}.onnx.data", "precision": "fp32",
                  "inputs": ["input_ids", "features", "position_ids"], "outputs": ["logits"],
                  "hidden_size": c.hidden_size},
        "kv": {"layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
               "max_context": max_context, "dtype": "float32"},
        "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids), "target_hidden_size": cfg.target_hidden_size,
        "vocab_size": loaded.config.vocab_size, "validation": {"max_abs_diff": diff}, **extra,
    }
