"""A model's source tensors read lazily: one tensor at a time, as float32, straight from its file.

`LazyWeights` is a read-only mapping HF name -> float32 array. Indexing it reads that tensor's bytes with one
positioned read (no memory map, so pages already read never stay in the process's resident memory), decodes
them and returns a fresh array that nothing else keeps: peak memory follows the largest tensor in use, not the
model. Shapes, byte sizes and the file each tensor lies in are known without reading any data, so the size
checks, the memory estimate and a truncated file are all found before conversion starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.errors import SourceError

READ_CHUNK = 1 << 28  # bytes per read call


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes lie and how they become a float32 array."""

    name: str  # the name in its file
    file: Path
    offset: int  # absolute byte offset in the file
    nbytes: int
    shape: tuple[int, ...]  # the shape of the decoded array
    decode: Callable[[bytes, tuple[int, ...]], np.ndarray]  # raw bytes of whole rows -> float32 array of a shape
    rows_apart: bool = True  # rows decode on their own (false where a decoder mixes rows, e.g. a permutation)
    dtype: str = ""  # as stored, where the file says (safetensors' "F16", "I64", ...)
    # GGUF: the ggml type (its name: "Q4_K", ...) and, where the loader undoes a converter's reordering, that
    # reordering (a permutation of whole rows or of whole blocks of columns; None: stored as read)
    gguf_type: str = ""
    reorder: Callable[[np.ndarray], np.ndarray] | None = None

    def read(self) -> np.ndarray:
        """The whole tensor. A large matrix is read and decoded in row chunks into one output array, so that its
        raw bytes are never all in memory beside it (a 248k x 4096 bf16 table: 2 GB saved)."""
        if len(self.shape) != 2 or not self.rows_apart or self.nbytes <= READ_CHUNK or self.nbytes % self.shape[0]:
            return self._decode(self._pread(self.offset, self.nbytes), self.shape)
        rows, width = self.shape[0], self.nbytes // self.shape[0]
        step = max(1, READ_CHUNK // width)
        out = None
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            part = self._decode(self._pread(self.offset + lo * width, n * width), (n, self.shape[1]))
            if out is None:
                out = np.empty(self.shape, dtype=part.dtype)
            out[lo:lo + n] = part
        return out

    def expert(self, index: int, shape: tuple[int, ...], decode=None, rows_apart: bool = True) -> "TensorRef":
        """Slice `index` of a tensor stacked along its leading axis (an MoE layer's experts: each one's bytes are
        contiguous), decoded to `shape` by `decode` (default: this tensor's own decoder, and its GGUF type kept: the
        slice is whole rows of the same blocks)."""
        per = self.nbytes // self.shape[0]
        return TensorRef(f"{self.name}[{index}]", self.file, self.offset + index * per, per, tuple(shape),
                         decode or self.decode, rows_apart, self.dtype, gguf_type="" if decode else self.gguf_type)

    def rows(self, start: int, count: int) -> "TensorRef":
        """Rows [start, start + count) of a matrix whose rows are stored apart (a fused projection's parts: Phi-3's
        qkv_proj); the GGUF storage type stays (each row's blocks are its own)."""
        if len(self.shape) != 2 or not self.rows_apart or self.reorder is not None or self.nbytes % self.shape[0]:
            raise SourceError(f"tensor {self.name}: its rows are not stored apart, so it cannot be split")
        if not (0 <= start and count > 0 and start + count <= self.shape[0]):
            raise SourceError(f"tensor {self.name} has {self.shape[0]} rows: rows {start}..{start + count} are not there")
        width = self.nbytes // self.shape[0]
        return dataclasses.replace(self, name=f"{self.name}[{start}:{start + count}]",
                                   offset=self.offset + start * width, nbytes=count * width,
                                   shape=(count, self.shape[1]))

    def raw(self) -> bytearray:
        """The tensor's bytes as stored."""
        return self._pread(self.offset, self.nbytes)

    def read_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a matrix [rows, cols], reading only those rows' bytes (an embedding lookup)."""
        if not self.rows_apart or len(self.shape) != 2:
            return self.read()[ids]
        width = self.nbytes // self.shape[0]
        unique, where = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)
        if len(unique) and unique[-1] - unique[0] + 1 == len(unique):  # a range of rows: one read
            raw = self._pread(self.offset + int(unique[0]) * width, len(unique) * width)
        else:
            raw = b"".join(self._pread(self.offset + int(r) * width, width) for r in unique)
        return self._decode(raw, (len(unique), self.shape[1]))[where]

    def _pread(self, offset: int, length: int) -> bytearray:
        """length bytes at offset, in reads of at most READ_CHUNK (one read stops short of 2 GiB on Linux)."""
        raw = bytearray(length)
        view, done = memoryview(raw), 0
        try:
            with open(self.file, "rb") as f:
                while done < length:
                    n = os.preadv(f.fileno(), [view[done:done + READ_CHUNK]], offset + done)
                    if n == 0:
                        break
                    done += n
        except OSError as exc:
            raise SourceError(f"{self.file}: cannot read tensor {self.name} ({exc.strerror or exc})") from None
        if done != length:
            raise SourceError(f"{self.file}: tensor {self.name} runs past the end of the file (truncated?)")
        return raw

    def _decode(self, raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
        try:
            arr = self.decode(raw, shape)
        except SourceError:
            raise
        except Exception as exc:  # a decoder's own error on bad bytes
            raise SourceError(f"{self.file}: tensor {self.name} is corrupt ({type(exc).__name__}: {exc})") from None
        return arr.reshape(shape)


class WeightSource(Mapping):
    """A read-only mapping of HF names to float32 arrays that can also read a few rows of a matrix."""

    def rows(self, name: str, ids) -> np.ndarray:
        return np.asarray(self[name])[ids]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(np.asarray(self[name]).shape)


class LazyWeights(WeightSource):
    """HF name -> float32 array, read from the source file on every access (the caller keeps what it needs)."""

    def __init__(self, refs: dict[str, TensorRef]):
        self._refs = dict(refs)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._refs[name].read()

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, name) -> bool:
        return name in self._refs

    def rows(self, name: str, ids) -> np.ndarray:
        return self._refs[name].read_rows(ids)

    def ref(self, name: str) -> TensorRef:
        return self._refs[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._refs[name].shape

    def float_bytes(self, name: str) -> int:
        """Bytes of the tensor as float32 (what one read of it costs in memory)."""
        return 4 * int(np.prod(self._refs[name].shape, dtype=np.int64))

    def materialize(self) -> dict[str, np.ndarray]:
        """Every tensor in memory at once (training and small models only: this is what streaming avoids)."""
        return {name: self[name] for name in self}


def file_size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from None


def check_inside(ref: TensorRef, size: int) -> None:
    """A tensor whose bytes run past its file's end (a truncated download) is found before conversion starts."""
    if ref.offset + ref.nbytes > size:
        stored = f" ({ref.gguf_type or ref.dtype})" if ref.gguf_type or ref.dtype else ""
        raise SourceError(f"{ref.file}: tensor {ref.name}{stored} runs past the end of the file "
                          f"(needs bytes up to {ref.offset + ref.nbytes}, the file has {size}: truncated?)")


class Subset(WeightSource):
    """The tensors of `base` whose names `keep` accepts, read from base when asked for (nothing copied)."""

    def rows(self, name: str, ids) -> np.ndarray:
        return rows_of(self.base, name, ids) if name in self._kept else self[name]

    def __init__(self, base: Mapping, keep: Callable[[str], bool]):
        self.base, self.names = base, [n for n in base if keep(n)]
        self._kept = set(self.names)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._kept:
            raise KeyError(name)
        return self.base[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return shape_of(self.base, name)

    def __contains__(self, name) -> bool:
        return name in self._kept

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def rows_of(weights: Mapping, name: str, ids) -> np.ndarray:
    """Rows `ids` of a matrix of any weights mapping, reading only those rows where the mapping can."""
    if isinstance(weights, WeightSource):
        return weights.rows(name, ids)
    return np.asarray(weights[name])[ids]


def head_name(weights: Mapping, tied: bool) -> str:
    """The name of a loaded model's output head [V, H]: its lm_head, or its embedding table where the two are
    tied or the checkpoint has no lm_head."""
    return "lm_head.weight" if "lm_head.weight" in weights and not tied else "model.embed_tokens.weight"


def shape_of(weights: Mapping, name: str) -> tuple[int, ...]:
    """A tensor's shape, without reading it where the mapping can tell."""
    if isinstance(weights, WeightSource):
        return weights.shape(name)
    return tuple(np.asarray(weights[name]).shape)
