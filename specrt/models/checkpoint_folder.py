"""Reading a drafter's checkpoint folder (config.json + *.safetensors, never pickle files) and checking its
tensors against the shapes its config implies: shared by the EAGLE-3 and DFlash loaders, with messages that
name the first problem."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from specrt.errors import SourceError
from specrt.models.tensor_source import TensorRef, check_inside, file_size
from specrt.tensor_file import decode, read_header


def open_checkpoint(folder: Path, what: str) -> tuple[dict, list[Path]]:
    """(config.json as a dict, the safetensors files) of a checkpoint folder; `what` names it in errors, e.g.
    "an EAGLE-3 checkpoint folder"."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise SourceError(f"{folder}: no config.json ({what} has config.json + *.safetensors)")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in folder.glob("*") if p.suffix in (".bin", ".pt", ".pth"))
        hint = f" ({pickled[0]} is a pickle file, which specrt does not load)" if pickled else ""
        raise SourceError(f"{folder}: no .safetensors weights{hint}")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise SourceError(f"{folder}/config.json: not readable JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(config, dict):
        raise SourceError(f"{folder}/config.json: must be a JSON object, not {type(config).__name__}")
    return config, files


def tensor_refs(files: list[Path], rename) -> dict[str, TensorRef]:
    """Where every tensor of the files lies, under rename(name), read by nothing yet (a truncated file is a
    SourceError naming the tensor)."""
    refs: dict[str, TensorRef] = {}
    for f in files:
        size = file_size(f)
        for t in read_header(f, error=SourceError):
            ref = TensorRef(t.name, f, t.offset, t.nbytes, t.shape, functools.partial(decode, t.dtype), dtype=t.dtype)
            check_inside(ref, size)
            refs[rename(t.name)] = ref
    return refs


def read_tensors(files: list[Path], rename) -> dict[str, np.ndarray]:
    """Every tensor of the files, under rename(name), in its stored dtype (BF16, which numpy lacks and most
    published heads use, widened to float32)."""
    return {name: ref.read() for name, ref in tensor_refs(files, rename).items()}


FLOATS = {"F16", "BF16", "F32", "float16", "float32"}  # what weights may be stored as (BF16 reads as float32)
INTEGERS = {"I64", "I32", "int64", "int32"}  # what an id map (d2t) may be stored as
ID_MAPS = {"d2t", "masked_embedding.token_ordering"}  # id maps: an EAGLE-3 head's, a Gemma 4 assistant's


def _stored(tensor) -> str:
    """A tensor's stored dtype name: a TensorRef's safetensors name, or a numpy array's dtype name."""
    return tensor.dtype if isinstance(getattr(tensor, "dtype", None), str) else str(getattr(tensor, "dtype", ""))


def check_tensors(folder: Path, tensors: dict, want: dict[str, tuple[int, ...]], label: str,
                  optional=frozenset()) -> None:
    """The first missing, unexpected (not in want or optional), misshaped or mistyped tensor (weights in F16,
    BF16 or F32; d2t in I64 or I32) is a SourceError; `label` names the checkpoint kind ("EAGLE-3 checkpoint")."""
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise SourceError(f"{folder}: {label} lacks tensor {missing[0]}")
    extra = sorted(set(tensors) - set(want) - set(optional))
    if extra:
        raise SourceError(f"{folder}: {label} has an unexpected tensor {extra[0]}")
    for name, shape in want.items():
        if tuple(tensors[name].shape) != shape:
            raise SourceError(f"{folder}: tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
    for name, tensor in tensors.items():
        stored = _stored(tensor)
        if not stored or name == "t2d":  # unknown (an in-memory source), or a mask the loaders do not read
            continue
        allowed = INTEGERS if name in ID_MAPS else FLOATS
        if stored not in allowed:
            raise SourceError(f"{folder}: tensor {name} is stored as {stored}, expected one of "
                              f"{', '.join(sorted(a for a in allowed if a.isupper()))}")
