"""Read a safetensors file with numpy alone (standard library + numpy; shared by convert and runtime).

The runtime reads small side files of a bundle (a drafter's d2t map) in installs that have no `safetensors`
package: the format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, data_offsets
relative to the end of the header), then the raw little-endian tensor bytes. Nothing in it is executed.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from specrt.errors import BundleError

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
MAX_HEADER = 100 * 1024 * 1024  # what the safetensors package itself accepts


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file at path, as numpy arrays (BF16 widened to float32). A malformed file is a
    one-line BundleError naming it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) < 8:
        raise BundleError(f"{path}: not a safetensors file (shorter than its header length)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(MAX_HEADER, len(data) - 8):
        raise BundleError(f"{path}: not a safetensors file (header length {size} past the end of the file)")
    try:
        header = json.loads(data[8:8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BundleError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise BundleError(f"{path}: not a safetensors file (its header is not a JSON object)")
    body = memoryview(data)[8 + size:]
    return {name: _tensor(path, name, info, body) for name, info in header.items() if name != "__metadata__"}


def _tensor(path: Path, name: str, info, body: memoryview) -> np.ndarray:
    try:
        dtype, shape, (begin, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise BundleError(f"{path}: tensor {name!r} has no valid dtype, shape and data_offsets") from None
    width = 2 if dtype == "BF16" else np.dtype(DTYPES[dtype]).itemsize if dtype in DTYPES else None
    if width is None:
        raise BundleError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
    count = int(np.prod(shape, dtype=np.int64))
    if min(shape, default=0) < 0 or not (isinstance(begin, int) and isinstance(end, int)) \
            or not 0 <= begin <= end <= len(body) or end - begin != count * width:
        raise BundleError(f"{path}: tensor {name!r} does not fit its data_offsets {[begin, end]}")
    raw = body[begin:end]
    if dtype == "BF16":
        bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(raw, np.dtype(DTYPES[dtype]).newbyteorder("<")).reshape(shape).copy()
