"""Weight rows interleaved by 8, the layout specrt's GGUF operators read (ggml_kernels.c says why and where each
byte goes): the file's own bytes, placed elsewhere. interleave() writes a tensor's blocks so for the bundle;
deinterleave() reads them back. A row count that is not a multiple of 8 is padded with zero rows."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

ROWS = 8
BLOCK_BYTES = {"Q5_0": 22, "Q5_1": 24, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def offset(qtype: str, r: int, j: int) -> int:
    """Where byte j of row r's block lies in a group's block (specrt_ggml_group_offset in ggml_kernels.c)."""
    i = j % 4
    if qtype == "Q4_K":
        if j < 4:
            return 16 * (j // 2) + 2 * r + j % 2  # d, then dmin
        if j < 16:
            return 32 + 4 * (8 * ((j - 4) // 4) + r) + i  # the scales' three words
        return 128 + 4 * (8 * ((j - 16) // 4) + r) + i  # nibbles, 4 bytes a row at a time
    if qtype == "Q5_K":
        if j < 16:
            return offset("Q4_K", r, j)  # d, dmin and the scales as Q4_K's
        if j < 48:
            return 128 + 4 * (8 * ((j - 16) // 4) + r) + i  # the fifth bits
        return 384 + 4 * (8 * ((j - 48) // 4) + r) + i  # nibbles, as Q4_K's
    if qtype == "Q6_K":
        if j < 128:
            return 4 * (8 * (j // 4) + r) + i  # low nibbles
        if j < 192:
            return 1024 + 4 * (8 * ((j - 128) // 4) + r) + i  # high bits
        if j < 208:
            return 1536 + 8 * (j - 192) + r  # scales
        return 1664 + 2 * r + (j - 208)  # d
    has_min = qtype == "Q5_1"
    words = 32 if has_min else 16
    if j < (4 if has_min else 2):
        return 16 * (j // 2) + 2 * r + j % 2  # d (and m)
    bits = 4 if has_min else 2
    if j < bits + 4:
        return words + 4 * r + (j - bits)  # the fifth bits
    return words + 32 + 4 * (8 * ((j - bits - 4) // 4) + r) + (j - bits - 4) % 4


@lru_cache(maxsize=None)
def _sources(qtype: str) -> np.ndarray:
    """[8 * block bytes]: for each byte of a group's block, the byte of the 8 rows' blocks [8, block bytes] it holds."""
    size = BLOCK_BYTES[qtype]
    dest = np.array([[offset(qtype, r, j) for j in range(size)] for r in range(ROWS)]).reshape(-1)
    src = np.empty(ROWS * size, np.int64)
    src[dest] = np.arange(ROWS * size)
    assert np.array_equal(np.sort(dest), np.arange(ROWS * size)), qtype  # a permutation of the group's bytes
    return src


def interleave(qtype: str, blocks: np.ndarray) -> np.ndarray:
    """A tensor's blocks as the file holds them [N, row bytes] -> [ceil(N / 8), row bytes * 8] interleaved."""
    n, row = blocks.shape
    size = BLOCK_BYTES[qtype]
    groups = -(-n // ROWS)
    padded = np.zeros((groups * ROWS, row), np.uint8)
    padded[:n] = blocks
    by_block = padded.reshape(groups, ROWS, row // size, size).transpose(0, 2, 1, 3).reshape(groups, row // size, -1)
    return np.ascontiguousarray(by_block[..., _sources(qtype)].reshape(groups, -1))


def deinterleave(qtype: str, packed: np.ndarray, n: int) -> np.ndarray:
    """interleave's inverse: [groups, row bytes * 8] -> the first n rows' blocks [n, row bytes]."""
    groups = packed.shape[0]
    size = BLOCK_BYTES[qtype]
    nb = packed.shape[1] // (ROWS * size)
    by_block = np.empty((groups, nb, ROWS * size), np.uint8)
    by_block[..., _sources(qtype)] = packed.reshape(groups, nb, -1)
    rows = by_block.reshape(groups, nb, ROWS, size).transpose(0, 2, 1, 3).reshape(groups * ROWS, nb * size)
    return np.ascontiguousarray(rows[:n])
