"""Hostile safetensors files and shard indexes (issue 48): each is one line of SourceError (BundleError for a
bundle's side file) naming the file and what is wrong, found from the header alone with nothing large allocated;
never an internal error (OverflowError, RecursionError, TypeError) and never a file wrongly accepted."""

from __future__ import annotations

import json
import struct
import tracemalloc

import pytest

from specrt.errors import BundleError, SourceError, SpecrtError
from specrt.models.hf_loader import load_hf_weights
from specrt.tensor_file import MAX_HEADER, read_safetensors

# the two readers of a safetensors file: a model folder's shard (the converter) and a bundle's side file (runtime)
READERS = {"hf_folder": (lambda path: load_hf_weights(path.parent), SourceError),
           "bundle_file": (read_safetensors, BundleError)}


def _write(path, text: bytes, body: bytes = b"", length: int | None = None):
    """A safetensors file: the 8-byte little-endian header length (the true one unless given), header, body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + body)
    return path


def _refused(call, path, error, *fragments) -> str:
    """The message of the one-line `error` that call() raises, which names path and holds every fragment; the
    call's peak Python allocation stays small (nothing sized by the file's claims)."""
    tracemalloc.start()
    try:
        with pytest.raises(SpecrtError) as info:
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert info.type is error, message
    assert "\n" not in message and str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert peak < 16 * 2**20, peak
    return message


@pytest.fixture(params=sorted(READERS))
def reader(request):
    return READERS[request.param]


def _tensor(shape, offsets, dtype="F32") -> bytes:
    return json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}).encode()


def test_shape_whose_size_wraps_int64_is_refused(tmp_path, reader):
    """(a) 2**32 * 2**32 elements wrapped to 0 in int64 arithmetic: the header claimed 0 bytes and was accepted."""
    path = _write(tmp_path / "model.safetensors", _tensor([2**32, 2**32], [0, 0]))
    _refused(lambda: reader[0](path), path, reader[1], "tensor 't' does not fit its data_offsets [0, 0]",
             "73786976294838206464 bytes")


def test_shape_past_int64_is_refused(tmp_path, reader):
    """(b) a dimension of 2**70 raised OverflowError converting it to int64."""
    path = _write(tmp_path / "model.safetensors", _tensor([2**70], [0, 0]))
    _refused(lambda: reader[0](path), path, reader[1], "tensor 't' does not fit", "dimension of 2**63 or more")


@pytest.mark.parametrize("depth", [100_000, 50])
def test_deeply_nested_header_is_refused(tmp_path, reader, depth):
    """(c) nesting past the recursion limit raised RecursionError from json.loads; nesting below it (in the
    metadata, which nothing else checks) was accepted."""
    text = b'{"__metadata__": ' + b"[" * depth + b"]" * depth + b"}"
    path = _write(tmp_path / "model.safetensors", text)
    _refused(lambda: reader[0](path), path, reader[1], "its header is nested too deeply")


@pytest.mark.parametrize("length, size, fragment", [
    (2**64 - 1, 0, "header length 18446744073709551615 past the end of the file"),
    (MAX_HEADER + 1, MAX_HEADER + 64, f"header length {MAX_HEADER + 1} over the limit of 100 MB"),
])
def test_header_length_bomb_is_refused_before_reading(tmp_path, reader, length, size, fragment):
    """The 8-byte header length is the file's claim: past the file, or past MAX_HEADER in a file that big (sparse
    here), it is refused before a byte of header is read. The second said "past the end of the file" before."""
    path = _write(tmp_path / "model.safetensors", b"{}", length=length)
    with open(path, "r+b") as f:
        f.truncate(max(size, 10))
    _refused(lambda: reader[0](path), path, reader[1], "not a safetensors file", fragment)


@pytest.mark.parametrize("text, body, fragment", [
    (_tensor([1], [0, 4], dtype=["F32"]), bytes(4), "unsupported dtype ['F32']"),  # was TypeError (unhashable)
    (b'{"t": {"dtype": "F32", "shape": [' + b"1" * 5000 + b'], "data_offsets": [0, 4]}}', bytes(4),
     "its header is not JSON"),  # was ValueError from int(): past Python's 4300 digits
    (_tensor([True], [0, 4]), bytes(4), "no valid dtype, shape and data_offsets"),  # was read as shape (1,)
    (_tensor([1.5], [0, 4]), bytes(4), "no valid dtype, shape and data_offsets"),  # was truncated to shape (1,)
    (_tensor([1], [True, 5]), bytes(5), "no valid dtype, shape and data_offsets"),  # was read as offsets [1, 5]
    (_tensor([1], [0, 4, 8]), bytes(8), "no valid dtype, shape and data_offsets"),  # refused before too: a guard
    (_tensor([1] * 40, [0, 4]), bytes(4), "has 40 dimensions"),
    (_tensor([2, -2], [0, 16]), bytes(16), "negative dimension"),  # was -4 elements * 4 bytes != 16 by luck only
    (_tensor([-2, -2], [0, 16]), bytes(16), "negative dimension"),  # was accepted: (-2) * (-2) * 4 == 16
    ('{"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'.encode("utf-16"), bytes(4),
     "its header is not JSON"),  # was accepted: json.loads guessed UTF-16 from the bytes
])
def test_malformed_entries_are_refused(tmp_path, reader, text, body, fragment):
    path = _write(tmp_path / "model.safetensors", text, body)
    _refused(lambda: reader[0](path), path, reader[1], fragment)


def _folder_with_index(tmp_path, weight_map):
    folder = tmp_path / "model"
    _write(folder / "model.safetensors", _tensor([1], [0, 4]), bytes(4))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("shard, shown", [(5, "5"), (["model.safetensors"], "list"), (None, "None"), ("", "''")])
def test_index_weight_map_value_that_is_not_a_file_name_is_refused(tmp_path, shard, shown):
    """(d) {"weight_map": {"t": 5}} raised TypeError (Path / int); a list raised TypeError (unhashable)."""
    folder = _folder_with_index(tmp_path, {"t": shard})
    index = folder / "model.safetensors.index.json"
    _refused(lambda: load_hf_weights(folder), index, SourceError,
             f"weight_map puts tensor 't' in {shown}, which is not a file name in {folder}")


@pytest.mark.parametrize("outside", ["../outside.safetensors", "absolute"])
def test_index_weight_map_cannot_point_outside_the_folder(tmp_path, outside):
    """(d) a shard named by a path was read wherever it pointed: a valid file outside the folder was accepted."""
    target = _write(tmp_path / "outside.safetensors", _tensor([1], [0, 4]), bytes(4))
    shard = str(target) if outside == "absolute" else outside
    folder = _folder_with_index(tmp_path, {"t": shard})
    (folder / "model.safetensors").unlink()  # the outside file is the only one holding t
    _refused(lambda: load_hf_weights(folder), folder / "model.safetensors.index.json", SourceError,
             f"weight_map puts tensor 't' in {shard!r}, which is not a file name")


@pytest.mark.parametrize("text", [b"[" * 100_000 + b"]" * 100_000, b'["weight_map"]', b'"weight_map"'])
def test_index_that_is_not_an_object_is_refused(tmp_path, text):
    """An index nested past the recursion limit raised RecursionError; a list or string raised TypeError."""
    folder = _folder_with_index(tmp_path, {})
    index = folder / "model.safetensors.index.json"
    index.write_bytes(text)
    _refused(lambda: load_hf_weights(folder), index, SourceError, "unreadable index")


def test_well_formed_files_still_load(tmp_path, reader):
    """The checks refuse nothing real: a folder with an index naming its shard, a scalar, an empty tensor."""
    header = {"__metadata__": {"format": "pt"},
              "t": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "s": {"dtype": "BF16", "shape": [], "data_offsets": [24, 26]},
              "e": {"dtype": "I64", "shape": [0, 5], "data_offsets": [26, 26]}}
    folder = _folder_with_index(tmp_path, {"t": "model.safetensors", "s": "model.safetensors",
                                           "e": "model.safetensors"})
    path = _write(folder / "model.safetensors", json.dumps(header).encode(), bytes(26))
    loaded = reader[0](path)
    assert set(loaded) == ({"t", "s", "e"} if reader[1] is BundleError else {"model.t", "model.s", "model.e"})
