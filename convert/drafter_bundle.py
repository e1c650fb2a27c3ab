"""`specrt convert SOURCE --drafter KIND:ARG`: put a drafter's graph into the bundle beside the target.

Kinds available: `eagle3:FOLDER` (an EAGLE-3 checkpoint, convert/eagle3_bundle.py), `dflash:FOLDER` (a DFlash
block-diffusion drafter, convert/dflash_bundle.py), `mtp` (the MTP module in
the target's own checkpoint) or `mtp:FOLDER` (one trained for it, convert/mtp_bundle.py) and `draft-model` (an independent small LM with the
target's tokenizer and its own KV cache), whose ARG is one of
- `self-int4`: the int4 graph of the target's own weights (drafts for an fp32/fp16 target);
- a specrt bundle folder: its target graph is copied in as the draft graph (no reconversion);
- a conversion source (HF folder, .gguf file or catalog name): converted at the target's precision.
The drafter's tokenizer must equal the target's (same token for every id); convert refuses otherwise and
names the first id that differs. The manifest gets one entry per drafter (see `DraftModelEntry`).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from specrt.bundle import MANIFEST, KVLayout, load_bundle
from specrt.errors import SourceError, SpecrtError

DRAFT_STEM = "draft"
AVAILABLE_KINDS = ("draft-model", "eagle3", "mtp", "dflash")
LATER_KINDS = ()
FOLDER_KINDS = ("eagle3", "mtp", "dflash")  # KIND:FOLDER names a checkpoint folder


def drafter_specs(spec) -> tuple[str, ...]:
    """--drafter given once (a string), several times (a tuple) or not at all (None): a tuple of specs, one per
    kind (a bundle holds at most one drafter of each kind)."""
    specs = () if not spec else (spec,) if isinstance(spec, str) else tuple(spec)
    kinds = [parse_drafter_spec(s)[0] for s in specs]
    twice = next((k for k in kinds if kinds.count(k) > 1), None)
    if twice:
        raise SpecrtError(f"--drafter {twice} given twice: a bundle holds one drafter of each kind")
    return specs


def parse_drafter_spec(spec: str) -> tuple[str, str]:
    kind, _, arg = spec.partition(":")
    if kind == "ngram":
        raise SpecrtError("the ngram drafter needs no conversion: pass --drafter ngram when you run the bundle")
    if kind in LATER_KINDS:
        raise SpecrtError(f"drafter kind {kind!r} is not available yet (available: {', '.join(AVAILABLE_KINDS)})")
    if kind not in AVAILABLE_KINDS:
        raise SpecrtError(f"unknown drafter kind {kind!r} in --drafter {spec!r} (expected draft-model:PATH_OR_NAME, "
                          f"eagle3:FOLDER, dflash:FOLDER or mtp)")
    if kind == "mtp":
        return kind, arg  # no ARG: the target's own checkpoint; mtp:FOLDER: a module trained for it
    if not arg:
        raise SpecrtError(f"--drafter {spec!r} names no model (draft-model:PATH_OR_NAME or draft-model:self-int4)")
    return kind, arg


def check_drafter_spec(spec: str, precision: str) -> None:
    """Refuse a bad --drafter before any work is done."""
    kind, arg = parse_drafter_spec(spec)
    if kind in FOLDER_KINDS and arg and not Path(arg).expanduser().is_dir():
        raise SpecrtError(f"{kind}:{arg}: no such checkpoint folder")
    if arg == "self-int4" and precision == "int4":
        raise SpecrtError("draft-model:self-int4 drafts for an fp32 or fp16 target; this target is already int4")


def drafter_stages(spec: str | None) -> int:
    """How many progress stages adding this drafter takes (a bundle is copied within the last stage)."""
    if not spec:
        return 0
    kind, arg = parse_drafter_spec(spec)
    if kind in FOLDER_KINDS:
        return 2  # build, validate
    if arg == "self-int4":
        return 3  # build, save, validate
    path = Path(arg).expanduser()
    return 0 if (path / MANIFEST).is_file() else 4  # load, build, save, validate


def hidden_layers_for(spec: str | None, loaded) -> tuple[int, ...]:
    """Target layers whose hidden states the drafter reads (EAGLE-3: its three aux layers; MTP: the last).
    Asked before the target graph is built, so a drafter that does not fit the target fails early."""
    if not spec:
        return ()
    kind, arg = parse_drafter_spec(spec)
    if kind == "mtp":
        from specrt.convert.mtp_bundle import hidden_layers_for as mtp_layers

        return mtp_layers(loaded, arg)
    if kind == "dflash":
        from specrt.convert.dflash_bundle import hidden_layers_for as dflash_layers

        return dflash_layers(arg, loaded.config)
    if kind != "eagle3":
        return ()
    from specrt.convert.eagle3_bundle import hidden_layers_for as eagle3_layers

    return eagle3_layers(arg, loaded.config)


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


def add_drafter(spec: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages, build_graph) -> dict:
    """Write the drafter's graph into tmp; returns its manifest entry."""
    from specrt.convert import sources

    kind, arg = parse_drafter_spec(spec)
    if kind == "eagle3":
        from specrt.convert.eagle3_bundle import add_eagle3

        return add_eagle3(spec, arg, tmp, loaded, precision, max_context, providers, stages)
    if kind == "mtp":
        from specrt.convert.mtp_bundle import add_mtp

        return add_mtp(spec, arg, tmp, loaded, precision, max_context, providers, stages)
    if kind == "dflash":
        from specrt.convert.dflash_bundle import add_dflash

        return add_dflash(spec, arg, tmp, loaded, precision, max_context, providers, stages)
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
