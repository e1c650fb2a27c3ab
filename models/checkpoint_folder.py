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
    return json.loads((folder / "config.json").read_text()), files


def tensor_refs(files: list[Path], rename) -> dict[str, TensorRef]:
    """Where every tensor of the files lies, under rename(name), read by nothing yet (a truncated file is a
    SourceError naming the tensor)."""
    refs: dict[str, TensorRef] = {}
    for f in files:
        size = file_size(f)
        for t in read_header(f, error=SourceError):
            ref = TensorRef(t.name, f, t.offset, t.nbytes, t.shape, functools.partial(decode, t.dtype))
            check_inside(ref, size)
            refs[rename(t.name)] = ref
    return refs


def read_tensors(files: list[Path], rename) -> dict[str, np.ndarray]:
    """Every tensor of the files, under rename(name), in its stored dtype (BF16, which numpy lacks and most
    published heads use, widened to float32)."""
    return {name: ref.read() for name, ref in tensor_refs(files, rename).items()}


def check_tensors(folder: Path, tensors: dict, want: dict[str, tuple[int, ...]], label: str,
                  optional=frozenset()) -> None:
    """The first missing, unexpected (not in want or optional) or misshaped tensor is a SourceError; `label`
    names the checkpoint kind ("EAGLE-3 checkpoint")."""
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise SourceError(f"{folder}: {label} lacks tensor {missing[0]}")
    extra = sorted(set(tensors) - set(want) - set(optional))
    if extra:
        raise SourceError(f"{folder}: {label} has an unexpected tensor {extra[0]}")
    for name, shape in want.items():
        if tuple(tensors[name].shape) != shape:
            raise SourceError(f"{folder}: tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
