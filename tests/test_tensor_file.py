"""specrt.tensor_file reads what the safetensors package writes, with numpy alone, and names malformed files."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from specrt.errors import BundleError
from specrt.tensor_file import read_safetensors


def test_reads_what_safetensors_writes(tmp_path):
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(0)
    tensors = {"f32": torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float32)),
               "f16": torch.from_numpy(rng.standard_normal(7).astype(np.float16)),
               "bf16": torch.from_numpy(rng.standard_normal((2, 4)).astype(np.float32)).to(torch.bfloat16),
               "i64": torch.tensor([-3, 0, 2**40]), "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
               "u8": torch.tensor([0, 255], dtype=torch.uint8), "scalar": torch.tensor(1.5)}
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"format": "pt"})
    got = read_safetensors(tmp_path / "t.safetensors")
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        want = want.float().numpy() if name == "bf16" else want.numpy()
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert np.array_equal(got[name], want), name


def _file(header: dict, body: bytes = b"", size: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if size is None else size) + text + body


@pytest.mark.parametrize("data, message", [
    (b"\x01\x02", "shorter than its header length"),
    (_file({}, size=10**9), "past the end of the file"),
    (struct.pack("<Q", 4) + b"{no}", "header is not JSON"),
    (_file([1, 2]), "not a JSON object"),
    (_file({"d2t": {"dtype": "I64", "shape": [2]}}, bytes(16)), "no valid dtype, shape and data_offsets"),
    (_file({"d2t": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, bytes(16)), "unsupported dtype"),
    (_file({"d2t": {"dtype": "I64", "shape": [3], "data_offsets": [0, 16]}}, bytes(16)), "does not fit"),
    (_file({"d2t": {"dtype": "I64", "shape": [2], "data_offsets": [8, 24]}}, bytes(16)), "'d2t' runs past the end of the file"),
    (_file({"d2t": {"dtype": "I64", "shape": [-2], "data_offsets": [0, 16]}}, bytes(16)), "does not fit"),
])
def test_malformed_files_are_named(tmp_path, data, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(BundleError, match=message) as info:
        read_safetensors(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(BundleError, match="cannot read"):
        read_safetensors(tmp_path / "none.safetensors")
