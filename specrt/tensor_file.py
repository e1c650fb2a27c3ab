"""Read a safetensors file with numpy alone (standard library + numpy; shared by convert and runtime).

The runtime reads small side files of a bundle (a drafter's d2t map) in installs that have no `safetensors`
package, and conversion reads a model's shards one tensor at a time: the format is an 8-byte little-endian
header length, a JSON header (name -> dtype, shape, data_offsets relative to the end of the header), then the
raw little-endian tensor bytes. Nothing in it is executed.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.errors import BundleError

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
MAX_HEADER = 100 * 1024 * 1024  # what the safetensors package itself accepts


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
    file is a one-line `error` naming it (and the tensor)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise error(f"{path}: not a safetensors file (shorter than its header length)")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER, size - 8):
                raise error(f"{path}: not a safetensors file (header length {length} past the end of the file)")
            text = f.read(length)
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise error(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise error(f"{path}: not a safetensors file (its header is not a JSON object)")
    body_start, body_size = 8 + length, size - 8 - length
    return [_stored(path, name, info, body_start, body_size, error)
            for name, info in header.items() if name != "__metadata__"]


def _stored(path: Path, name: str, info, body_start: int, body_size: int, error) -> StoredTensor:
    try:
        dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise error(f"{path}: tensor {name!r} has no valid dtype, shape and data_offsets") from None
    width = 2 if dtype == "BF16" else np.dtype(DTYPES[dtype]).itemsize if dtype in DTYPES else None
    if width is None:
        raise error(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
    count = int(np.prod(shape, dtype=np.int64))
    if not (isinstance(begin, int) and isinstance(end, int)) or min(shape, default=0) < 0 \
            or not 0 <= begin <= end or end - begin != count * width:
        raise error(f"{path}: tensor {name!r} does not fit its data_offsets {[begin, end]}")
    if end > body_size:
        raise error(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
    return StoredTensor(name, dtype, shape, body_start + begin, end - begin)


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
