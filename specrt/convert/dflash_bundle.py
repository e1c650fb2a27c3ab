"""`specrt convert TARGET --drafter dflash:FOLDER`: a DFlash checkpoint (reference layout, models/dflash.py)
into the bundle as dflash.onnx (convert/dflash_graph.py), validated against the torch drafter run layer by
layer. The target graph then emits the hidden states of the drafter's layers (the pipeline asks
`hidden_layers_for` first).

The drafter runs quantized beside an int4 or int8 target (at its precision), else in fp32 (as the feature heads
do); its weights stream from the checkpoint into the graph one at a time, so an 8B model's drafter converts in the
memory of its largest tensor. Its block size is capped by the target graph's context. A checkpoint with a draft
vocabulary (d2t, models/dflash.py) keeps only those rows of the target's lm_head, and its d2t goes beside the graph
as dflash.d2t.safetensors (the EAGLE-3 head's format). A confidence head beside the checkpoint
(models/dflash_confidence.py) becomes the graph's accept_logits output, validated with the rest.

Validation as the feature heads' (convert/head_graph.py validate_graph): an fp32 graph must equal the torch
drafter within MAX_DIFF; an int4 or int8 graph, run with float activations, must equal the torch drafter holding the
very same quantized weights (read back from the data file), and its shipped int8-activation difference is recorded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle import checkpoint_sha256
from specrt.errors import SourceError

STEM = "dflash"


def check(arg: str, precision: str) -> None:
    """Nothing to refuse before work starts beyond the checkpoint folder (convert/drafter_bundle.py checks it)."""


def stages(arg: str) -> int:
    return 2  # build, validate


def hidden_layers_for(arg: str, loaded) -> tuple[int, ...]:
    """The target layers the drafter reads (its config's target_layer_ids)."""
    from specrt.models.dflash import open_dflash_checkpoint

    cfg, _, _ = open_dflash_checkpoint(Path(arg).expanduser(), loaded.config)
    return cfg.target_layer_ids


def add(spec: str, arg: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages,
        build_graph=None, *, device: str = "cpu") -> dict:
    """Write the drafter's graph (and d2t) into tmp, in the GPU profile beside a GPU target; returns its manifest
    entry."""
    from safetensors.numpy import save_file

    from specrt.convert.dflash_graph import DFlashWeights, max_difference, reference_outputs, write_dflash_graph
    from specrt.convert.gpu_profile import activation_dtype
    from specrt.dflash_io import BLOCK_LENGTH, CONTEXT_LENGTH
    from specrt.convert.head_graph import head_precision, validate_graph
    from specrt.convert.quant_rows import QuantReadback
    from specrt.convert.target_graph import GraphOptions
    from specrt.models.dflash import open_dflash_checkpoint
    from specrt.models.dflash_confidence import load_confidence_head
    from specrt.models.tensor_source import head_name

    folder = Path(arg).expanduser()
    cfg, tensors, d2t = open_dflash_checkpoint(folder, loaded.config)
    confidence = load_confidence_head(folder, cfg.layers.hidden_size, cfg.block_size)
    if cfg.block_size >= max_context:
        raise SourceError(f"DFlash block size {cfg.block_size} does not fit the target graph's context of "
                          f"{max_context} tokens (convert with a larger --max-context)")
    target_head = head_name(loaded.weights, loaded.config.tie_word_embeddings)
    extra, head_rows, out_vocab = {}, None, loaded.config.vocab_size
    if d2t is not None:  # a draft vocabulary: those rows of the lm_head only
        head_rows = np.arange(len(d2t)) + d2t
        out_vocab = len(d2t)
        save_file({"d2t": np.ascontiguousarray(d2t)}, str(tmp / f"{STEM}.d2t.safetensors"))
        extra = {"draft_vocab_size": len(d2t), "extra_files": [f"{STEM}.d2t.safetensors"]}
    weights = DFlashWeights(tensors, loaded.weights, target_head, head_rows)  # raw embeddings, as the reference
    # rotary tables cover the block drawn past the last context position
    opts = GraphOptions(precision=head_precision(precision), max_context=max_context + cfg.block_size,
                        device=device)
    stages.start(f"build {STEM} graph")
    written = write_dflash_graph(cfg, weights, opts, out_vocab, tmp, STEM, confidence)
    stages.done()
    stages.start(f"validate {STEM}")
    vocab = loaded.config.vocab_size
    quantized = bool(written.quant_rows)
    calls, reference = reference_outputs(cfg, QuantReadback(weights, written) if quantized else weights, vocab,
                                         confidence=confidence)
    validation, session = validate_graph(tmp / f"{STEM}.onnx", quantized, providers,
                                         lambda session: max_difference(session, cfg, calls, reference), "DFlash",
                                         opts.precision)
    del session
    stages.done()
    c = cfg.layers
    return {
        "kind": "dflash", "name": "dflash", "spec": spec, "source": str(folder), "source_sha256": checkpoint_sha256(folder),
        "model_config": c.to_dict(),
        "graph": {"file": f"{STEM}.onnx", "data_file": f"{STEM}.onnx.data", "precision": opts.precision,
                  "inputs": ["input_ids", "features", "position_ids"]
                  + ([CONTEXT_LENGTH, BLOCK_LENGTH] if device != "cpu" else []),
                  "outputs": ["logits"] + ([] if confidence is None else ["accept_logits"]),
                  "hidden_size": c.hidden_size},
        "kv": {"layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
               "max_context": max_context, "dtype": activation_dtype(opts.precision, device)},
        "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids), "target_hidden_size": cfg.target_hidden_size,
        "vocab_size": vocab, "validation": validation, **extra,
    }
