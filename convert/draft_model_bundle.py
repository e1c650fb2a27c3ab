"""`specrt convert SOURCE --drafter draft-model:ARG`: an independent small LM with the target's tokenizer and its own
KV cache, whose ARG is one of
- `self-int4`: the int4 graph of the target's own weights (drafts for an fp32/fp16 target);
- a specrt bundle folder: its target graph is copied in as the draft graph (no reconversion);
- a conversion source (HF folder, .gguf file or catalog name): converted at the target's precision.
The drafter's tokenizer must equal the target's (same token for every id); convert refuses otherwise and names the
first id that differs.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from specrt.bundle import MANIFEST, KVLayout, load_bundle
from specrt.errors import SourceError, SpecrtError

DRAFT_STEM = "draft"


def check(arg: str, precision: str) -> None:
    if arg == "self-int4" and precision == "int4":
        raise SpecrtError("draft-model:self-int4 drafts for an fp32 or fp16 target; this target is already int4")


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
        build_graph=None) -> dict:
    """Write the draft model's graph into tmp (build_graph: the pipeline's target-graph builder); returns its entry."""
    from specrt.convert import sources

    kind = "draft-model"
    if arg == "self-int4":
        draft_loaded, draft_precision = loaded, "int4"
    else:
        path = Path(arg).expanduser()
        if path.is_dir() and (path / MANIFEST).is_file():
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
    cfg = draft_loaded.config
    graph, validation = build_graph(tmp, DRAFT_STEM, draft_loaded, draft_precision, max_context, (), providers, stages)
    kv = KVLayout(layers=cfg.num_layers, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, max_context=max_context,
                  dtype="float16" if draft_precision == "fp16" else "float32")
    return {
        "kind": kind, "name": kind, "spec": spec,
        "source": str(draft_loaded.source.path), "source_sha256": draft_loaded.sha256,
        "model_config": cfg.to_dict(), "graph": dataclasses.asdict(graph), "kv": dataclasses.asdict(kv),
        "vocab_size": cfg.vocab_size, "validation": validation,
    }
