"""`specrt convert SOURCE --drafter draft-model:ARG`: an independent small LM with the target's tokenizer and its own
KV cache, whose ARG is one of
- `self-int4`: the int4 graph of the target's own weights (drafts for an fp32, fp16 or int8 target);
- a specrt bundle folder: its target graph is copied in as the draft graph (no reconversion);
- a conversion source (HF folder, .gguf file or catalog name): converted at the target's precision, its output
  head optionally cut to a draft vocabulary (`--draft-vocab N`, convert/draft_vocab_head.py).
The drafter's tokenizer must equal the target's (same token for every id); convert refuses otherwise and names the
first id that differs.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from specrt.bundle import MANIFEST, KVLayout, load_bundle
from specrt.convert.gpu_profile import activation_dtype
from specrt.convert.linear_attention_graph import state_layout
from specrt.errors import SourceError, SpecrtError

DRAFT_STEM = "draft"


def check(arg: str, precision: str) -> None:
    if arg == "self-int4" and precision == "int4":
        raise SpecrtError("draft-model:self-int4 drafts for an fp32, fp16 or int8 target; this target is already int4")


def stages(arg: str) -> int:
    """Progress stages: a bundle is copied within the last stage; self-int4 builds, saves and validates; another
    source is loaded first."""
    if arg == "self-int4":
        return 3
    return 0 if (Path(arg).expanduser() / MANIFEST).is_file() else 4


def hidden_layers_for(arg: str, loaded) -> tuple[int, ...]:
    return ()  # a draft model reads no target hidden states


def tokenizer_difference(target_json: Path, draft_json: Path) -> str | None:
    """None if both tokenizers map every id to the same token, else a one-line description of the first difference."""
    from tokenizers import Tokenizer

    a = {i: t for t, i in Tokenizer.from_file(str(target_json)).get_vocab(with_added_tokens=True).items()}
    b = {i: t for t, i in Tokenizer.from_file(str(draft_json)).get_vocab(with_added_tokens=True).items()}
    for i in sorted(set(a) | set(b)):
        if a.get(i) != b.get(i):
            return f"token id {i} is {a.get(i)!r} in the target and {b.get(i)!r} in the drafter"
    return None


def _refuse_mismatch(target_dir: Path, draft_tokenizer: Path, name: str) -> None:
    diff = tokenizer_difference(target_dir / "tokenizer.json", draft_tokenizer)
    if diff:
        raise SourceError(f"drafter {name} has a different tokenizer from the target's: {diff}")


def _from_bundle(path: Path, tmp: Path) -> dict:
    manifest = load_bundle(path, check_hashes=True)
    _refuse_mismatch(tmp, path / "tokenizer.json", str(path))
    if manifest.target.hidden_layers:
        raise SpecrtError(f"{path}: a bundle with hidden-state outputs cannot serve as a draft model")
    for suffix, name in (("onnx", manifest.target.file), ("onnx.data", manifest.target.data_file)):
        shutil.copyfile(path / name, tmp / f"{DRAFT_STEM}.{suffix}")
    graph = dataclasses.replace(manifest.target, file=f"{DRAFT_STEM}.onnx", data_file=f"{DRAFT_STEM}.onnx.data")
    _relink_external_data(tmp / graph.file, manifest.target.data_file, graph.data_file)
    return {
        "source": str(path), "source_sha256": manifest.provenance.get("source_sha256"),
        "model_config": manifest.model_config, "graph": dataclasses.asdict(graph), "kv": dataclasses.asdict(manifest.kv),
        "vocab_size": manifest.vocab_size,
        "validation": manifest.provenance.get("validation", {}),
    }


def _relink_external_data(model_file: Path, old: str, new: str) -> None:
    """Point the copied graph's external-data references at its new data file name."""
    if old == new:
        return
    import onnx

    model = onnx.load(str(model_file), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    onnx.save_model(model, str(model_file))


def add(spec: str, arg: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages,
        build_graph=None, *, draft_vocab: int = 0, device: str = "cpu") -> dict:
    """Write the draft model's graph into tmp (build_graph: the pipeline's target-graph builder); returns its entry.
    draft_vocab > 0: its output head keeps only that many of the most frequent tokens (convert/draft_vocab_head.py)."""
    from specrt.convert import sources

    kind = "draft-model"
    if arg == "self-int4":
        draft_loaded, draft_precision = loaded, "int4"
    else:
        path = Path(arg).expanduser()
        if path.is_dir() and (path / MANIFEST).is_file():
            if draft_vocab:
                raise SpecrtError("--draft-vocab cuts a draft model being converted, not one copied from a bundle")
            entry = _from_bundle(path, tmp)
            return {"kind": kind, "name": kind, "spec": spec, **entry}
        resolved = sources.resolve(arg, log=stages.log)
        stages.start("load drafter")
        draft_loaded, draft_precision = sources.load(resolved), precision
        stages.done()
        with tempfile.TemporaryDirectory(dir=tmp) as tok_dir:
            from specrt.convert.tokenizer import write_tokenizer

            dcfg = draft_loaded.config
            write_tokenizer(resolved.path, resolved.kind, Path(tok_dir), dcfg.eos_token_ids, dcfg.bos_token_id)
            _refuse_mismatch(tmp, Path(tok_dir) / "tokenizer.json", resolved.name)
    draft_loaded.config = cfg = draft_loaded.config.for_context(max_context)  # LongRoPE's factors for this context
    graph, validation = build_graph(tmp, DRAFT_STEM, draft_loaded, draft_precision, max_context, (), providers, stages,
                                    device=device)
    kv = KVLayout(layers=cfg.num_layers, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, max_context=max_context,
                  dtype=activation_dtype(draft_precision, graph.device),
                  layer_ids=cfg.kv_layer_ids, layer_shapes=cfg.kv_layer_shapes)
    states = state_layout(cfg)
    entry = {
        "kind": kind, "name": kind, "spec": spec,
        "source": str(draft_loaded.source.path), "source_sha256": draft_loaded.sha256,
        "model_config": cfg.to_dict(), "graph": dataclasses.asdict(graph), "kv": dataclasses.asdict(kv),
        "vocab_size": cfg.vocab_size, "validation": validation,
    }
    if states is not None:  # a hybrid draft model (a smaller Qwen3.5 drafting for a larger one)
        entry["states"] = dataclasses.asdict(states)
    if draft_vocab:
        entry.update(_cut_vocab(tmp, graph.file, kv, cfg.vocab_size, draft_vocab, providers, stages, states))
    return entry


def _cut_vocab(tmp: Path, graph_file: str, kv: KVLayout, vocab: int, size: int, providers, stages,
               states=None) -> dict:
    """Cut the draft graph's head to the `size` most frequent tokens of ShareGPT, check it against the whole head
    on a few tokens, write the d2t map; the entry fields that change."""
    import numpy as np
    from safetensors.numpy import save_file

    from specrt.convert.draft_vocab_head import CORPUS, corpus_texts, cut_output_head, frequent_ids
    from specrt.runtime.target_session import TargetSession, TargetSpec

    if not 1 <= size < vocab:
        raise SpecrtError(f"--draft-vocab must be between 1 and the draft model's vocabulary ({vocab}), got {size}")
    stages.log(f"cutting the draft model's output head to the {size} most frequent tokens")
    keep = frequent_ids(tmp / "tokenizer.json", vocab, size, corpus_texts())
    probe = np.array([keep[: min(8, len(keep))]], dtype=np.int64)

    def logits(v: int) -> np.ndarray:
        spec = TargetSpec(kv.layers, kv.kv_heads, kv.head_dim, 64, v, kv_dtype=kv.dtype, kv_layers=kv.layer_ids,
                          states=states, kv_shapes=kv.layer_shapes)
        return TargetSession(tmp / graph_file, spec, providers).forward(probe)[0]

    whole = logits(vocab)[:, keep]
    cut_output_head(tmp / graph_file, keep)
    diff = float(np.abs(logits(len(keep)) - whole).max())
    if diff > 1e-3:
        raise SpecrtError(f"the draft graph cut to {size} tokens disagrees with the whole one (max |diff| {diff:.2e})")
    d2t_file = f"{DRAFT_STEM}.d2t.safetensors"
    save_file({"d2t": np.ascontiguousarray(keep - np.arange(len(keep)), dtype=np.int64)}, str(tmp / d2t_file))
    return {"vocab_size": int(len(keep)), "extra_files": [d2t_file],
            "draft_vocab": {"size": int(len(keep)), "corpus": CORPUS, "check_max_abs_diff": diff}}
