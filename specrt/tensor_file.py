"""Read a safetensors file with numpy alone (standard library + numpy; shared by convert and runtime).

The runtime reads small side files of a bundle (a drafter's d2t map) in installs that have no `safetensors`
package, and conversion reads a model's shards one tensor at a time: the format is an 8-byte little-endian
header length, a JSON header (name -> dtype, shape, data_offsets relative to the end of the header), then the
raw little-endian tensor bytes. Nothing in it is executed.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.errors import BundleError

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
WIDTHS = {"BF16": 2, **{name: np.dtype(t).itemsize for name, t in DTYPES.items()}}  # bytes per element
MAX_HEADER = 100 * 1024 * 1024  # what the safetensors package itself accepts
MAX_NESTING = 4  # a header nests 3 deep (header object, a tensor's object, its shape list), plus one of slack
MAX_RANK = 32  # far beyond any real tensor, and within what numpy can reshape to


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file: where its bytes lie (absolute offset) and what they hold."""

    name: str
    dtype: str  # safetensors' name: "F32", "BF16", ...
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def read_header(path: Path, error=BundleError) -> list[StoredTensor]:
    """The tensors a safetensors file declares, checked against its size, reading only the header. A malformed
    file is a one-line `error` naming it (and the tensor); nothing is allocated beyond the header itself, which
    may not exceed the file or MAX_HEADER."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise error(f"{path}: not a safetensors file (shorter than its header length)")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise error(f"{path}: not a safetensors file (header length {length} past the end of the file)")
            if length > MAX_HEADER:  # checked before reading: the length is the file's word, not a fact
                raise error(f"{path}: not a safetensors file (header length {length} over the limit of "
                            f"{MAX_HEADER // 2**20} MB)")
            text = f.read(length)
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    header = _parse(path, text, error)
    body_start, body_size = 8 + length, size - 8 - length
    return [_stored(path, name, info, body_start, body_size, error)
            for name, info in header.items() if name != "__metadata__"]


def _parse(path: Path, text: bytes, error) -> dict:
    """The header's JSON object. Everything json.loads can raise on hostile text is a malformed file: bad UTF-8,
    bad JSON, a number past int()'s 4300 digits (a plain ValueError), nesting that exhausts its recursion."""
    try:
        header = json.loads(text.decode("utf-8"))  # the format says UTF-8: no guessing UTF-16/32 from the bytes
    except RecursionError:
        raise error(f"{path}: not a safetensors file (its header is nested too deeply)") from None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors too
        raise error(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise error(f"{path}: not a safetensors file (its header is not a JSON object)")
    if _nests_deeper(header, MAX_NESTING):  # shallower than the recursion limit but still no safetensors header
        raise error(f"{path}: not a safetensors file (its header is nested too deeply)")
    return header


def _nests_deeper(value, bound: int) -> bool:
    """Whether a parsed JSON value nests more than `bound` objects/arrays deep; level by level, not recursively,
    and it stops at the bound."""
    level = [value]
    for _ in range(bound + 1):
        level = [c for v in level if isinstance(v, (dict, list)) for c in (v.values() if isinstance(v, dict) else v)]
        if not level:
            return False
    return True


def _is_int(value) -> bool:
    return type(value) is int  # JSON's true/false parse as bools, which isinstance(_, int) would let through


def _show(value, limit: int = 60) -> str:
    """A value from the file shortened for a message (a hostile name or shape can be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _stored(path: Path, name: str, info, body_start: int, body_size: int, error) -> StoredTensor:
    """One tensor's entry, every field checked before anything is read or allocated. Sizes are Python ints, which
    do not wrap: a [2**32, 2**32] shape is 2**64 elements, not 0 (int64 arithmetic made it fit 0 bytes)."""
    where = f"{path}: tensor {_show(name)}"
    if not isinstance(info, dict):
        raise error(f"{where} has no valid dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not (isinstance(shape, list) and all(map(_is_int, shape))
            and isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))):
        raise error(f"{where} has no valid dtype, shape and data_offsets")
    width = WIDTHS.get(dtype) if isinstance(dtype, str) else None
    if width is None:
        raise error(f"{where} has unsupported dtype {_show(dtype)}")
    if len(shape) > MAX_RANK:
        raise error(f"{where} has {len(shape)} dimensions (at most {MAX_RANK} are supported)")
    begin, end = offsets
    if min(shape, default=0) < 0 or max(shape, default=0) >= 2**63:  # no file holds 2**63: keeps the product small
        raise error(f"{where} does not fit its data_offsets {_show(offsets)} (shape {_show(shape)} has a "
                    f"{'negative dimension' if min(shape) < 0 else 'dimension of 2**63 or more'})")
    need = math.prod(shape) * width
    if not 0 <= begin <= end or end - begin != need:
        shown = need if need < 10**30 else "over 10**30"
        raise error(f"{where} does not fit its data_offsets {_show(offsets)} (shape {_show(shape)} of {dtype} "
                    f"is {shown} bytes)")
    if end > body_size:
        raise error(f"{where} runs past the end of the file (truncated?)")
    return StoredTensor(name, dtype, tuple(shape), body_start + begin, end - begin)


def decode(dtype: str, raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor's raw bytes as a numpy array of its own dtype (BF16 widened to float32), a fresh copy."""
    if dtype == "BF16":  # the 16 bits are a float32's upper half: one output array, no temporaries
        out = np.zeros(len(raw) // 2, dtype="<u4")
        out.view("<u2")[1::2] = np.frombuffer(raw, "<u2")
        return out.view("<f4").reshape(shape)
    return np.frombuffer(raw, np.dtype(DTYPES[dtype]).newbyteorder("<")).reshape(shape).copy()


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file at path, as numpy arrays (BF16 widened to float32). A malformed file is a
    one-line BundleError naming it."""
    path = Path(path)
    tensors = read_header(path)
    try:
        with open(path, "rb") as f:
            return {t.name: decode(t.dtype, os.pread(f.fileno(), t.nbytes, t.offset), t.shape) for t in tensors}
    except OSError as exc:
        raise BundleError(f"{path}: cannot read ({exc.strerror or exc})") from None
