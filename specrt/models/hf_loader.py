"""Read an HF model folder: config.json plus safetensors shards (never pickle files), tensors read lazily."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specrt import archs
from specrt.errors import SourceError
from specrt.models.tensor_source import LazyWeights, TensorRef
from specrt.tensor_file import decode, read_header


def read_hf_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise SourceError(f"{folder}: no config.json (an HF model folder needs config.json and *.safetensors)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: unreadable config ({exc})") from None


MAX_INDEX = 100 * 1024 * 1024  # a real index is a few MB at most; refused before it is read into memory


def _index(folder: Path) -> dict | None:
    """The weight map of model.safetensors.index.json (tensor name -> shard file name), if the folder has one. An
    index that is not JSON, too large or too deep to be one, or whose weight_map is not an object of file names in
    this folder, is a one-line SourceError naming it."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        size = index.stat().st_size
        if size > MAX_INDEX:
            raise ValueError(f"{size} bytes, over the limit of {MAX_INDEX // 2**20} MB")
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise ValueError("weight_map is not an object")
    except RecursionError:
        raise SourceError(f"{index}: unreadable index (nested too deeply)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # TypeError: the JSON is a list or a string
        raise SourceError(f"{index}: unreadable index ({exc})") from None
    for name, shard in weight_map.items():
        if not _shard_name(shard):  # a nested value is named by its type: its repr could be huge or deep
            shown = type(shard).__name__ if isinstance(shard, (list, dict)) else repr(shard)[:200]
            raise SourceError(f"{index}: weight_map puts tensor {name[:200]!r} in {shown}, which is not a file name "
                              f"in {folder}")
    return weight_map


def _shard_name(shard) -> bool:
    """Whether a weight_map value names a file directly inside the folder: a string with no path in it (a shard
    "../x" or "/x" would have the loader read a file outside the model folder)."""
    return isinstance(shard, str) and shard not in ("", ".", "..") and not any(c in shard for c in "/\\\0")


def safetensors_files(folder: Path) -> list[Path]:
    folder = Path(folder)
    weight_map = _index(folder)
    if weight_map is not None:
        files = [folder / s for s in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        if list(folder.glob("*.bin")) or list(folder.glob("*.pt")):
            raise SourceError(f"{folder}: only pickle weights (*.bin/*.pt); specrt loads safetensors only")
        raise SourceError(f"{folder}: no *.safetensors weights")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SourceError(f"{folder}: missing weight shard {missing[0]}")
    return files


def hf_name(name: str) -> str:
    """The HF name a checkpoint's tensor name stands for ("model." prefix normalized; a multimodal checkpoint's
    language model, model.language_model.*, read as the model)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith("language_model."):
        return name[len("language_model."):]
    return name if name.startswith(("model.", "lm_head.")) else f"model.{name}"


VISION_PREFIXES = ("model.visual.", "visual.")  # skipped: specrt converts the language model (said in the log)


def load_hf_weights(folder: Path, hf: dict | None = None) -> LazyWeights:
    """Every tensor of the folder's shards, read lazily as float32, under HF names. Only the shards' headers are
    read here: a missing shard, a tensor the index promises but its shard lacks, or a truncated shard is a
    one-line error naming the file and the tensor, before any conversion starts."""
    folder = Path(folder)
    weight_map = _index(folder)
    refs: dict[str, TensorRef] = {}
    found: dict[str, str] = {}
    for f in safetensors_files(folder):
        for t in read_header(f, error=SourceError):
            found[t.name] = f.name
            if t.name.startswith(VISION_PREFIXES):  # the vision tower of a multimodal checkpoint: text only here
                continue
            refs[hf_name(t.name)] = TensorRef(t.name, f, t.offset, t.nbytes, t.shape, _decoder(t.dtype))
    for name, shard in (weight_map or {}).items():
        if found.get(name) != shard:
            raise SourceError(f"{folder / shard}: lacks tensor {name}, which model.safetensors.index.json puts there")
    model_type = hf.get("model_type") if isinstance(hf, dict) else None
    arch = archs.BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    split = arch.hook("hf_refs") if arch else None  # fused tensors (experts, projections) read one part at a time
    if split is not None:
        try:
            refs = split(refs, hf)
        except SourceError as exc:
            raise SourceError(f"{folder}: {exc}") from None
    return LazyWeights(refs)


def _decoder(dtype: str):
    return lambda raw, shape: decode(dtype, raw, shape).astype(np.float32, copy=False)


def load_hf_folder(folder: Path) -> tuple[dict, LazyWeights]:
    folder = Path(folder)
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such folder")
    hf = read_hf_config(folder)
    return hf, load_hf_weights(folder, hf)
