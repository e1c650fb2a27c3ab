"""GGUF quantized blocks carried exactly into MatMulNBits' form (`--precision gguf`).

MatMulNBits multiplies by w = scale * (q - zero_point) per block of weights along a row, q stored in 4 or 8 bits with
uint8 zero points (the fast MLAS kernels; float zero points fall to a path that dequantizes all of B every call). Every
format below is that form exactly, some with a per-block minimum on top: w = scale * (q - zero_point) - min. The
minimum's contribution to x @ w^T is the block sums of x times the minimums, a small float matmul the graph subtracts
(convert/target_graph.py), so the weights stay llama.cpp's to the bit. Scales are the products ggml computes (an fp16
d times a small integer sub-scale: exact in float32, not in fp16).

Formats with a minimum (w = d * q + m) are centred: each block takes the integer zero point z nearest -m / d, and the
minimum keeps only the rest, m' = -(m + z * d), where that rest is exact in float32 (else z = 0 and m' = -m). The
weights are the same numbers; what changes is where MatMulNBits' int8 activations (accuracy level 4) err: against
d * (q - z), as for specrt's own int4, instead of against the whole uncentred d * q (top-1 92.2 % -> 96.4 % on a
Q4_1 model, llama.cpp 96.9 %: docs/performance.md, "Precision: fp32, int8, int4 and GGUF-exact weights").

| format | bits | block | zero point | minimum |
|---|---|---|---|---|
| Q4_0 | 4 | 32 | 8 | - |
| Q4_1 | 4 | 32 | 0 | -m |
| Q5_0 | 8 | 32 | 16 | - |
| Q5_1 | 8 | 32 | 0 | -m |
| Q8_0 | 8 | 32 | 128 (int8 q + 128) | - |
| Q2_K | 4 | 16 | 0 | dmin * m |
| Q3_K | 4 | 16 | 4 | - |
| Q4_K | 4 | 32 | 0 | dmin * m |
| Q5_K | 8 | 32 | 0 | dmin * m |
| Q6_K | 8 | 16 | 32 | - |

Block layouts as ggml writes them (gguf-py's `gguf.quants` reads them the same way; tests/test_gguf_exact.py holds
every format to its dequantization bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.convert.quantize import QuantWeight, _pack
from specrt.errors import SourceError
from specrt.kernels.ggml_ops import OPS

QK_K = 256
BLOCK_OPERATORS = tuple(OPS)  # the types specrt's own operators multiply by as the file's blocks (kernels/ggml_ops)


@dataclass(frozen=True)
class ExactForm:
    bits: int  # MatMulNBits storage bits per weight
    block: int  # weights per scale (and per minimum)
    zero_point: int  # the same for every block
    has_min: bool
    type_size: int  # bytes per GGUF block
    type_block: int  # weights per GGUF block


FORMS = {
    "Q4_0": ExactForm(4, 32, 8, False, 18, 32),
    "Q4_1": ExactForm(4, 32, 0, True, 20, 32),
    "Q5_0": ExactForm(8, 32, 16, False, 22, 32),
    "Q5_1": ExactForm(8, 32, 0, True, 24, 32),
    "Q8_0": ExactForm(8, 32, 128, False, 34, 32),
    "Q2_K": ExactForm(4, 16, 0, True, 84, QK_K),
    "Q3_K": ExactForm(4, 16, 4, False, 110, QK_K),
    "Q4_K": ExactForm(4, 32, 0, True, 144, QK_K),
    "Q5_K": ExactForm(8, 32, 0, True, 176, QK_K),
    "Q6_K": ExactForm(8, 16, 32, False, 210, QK_K),
}


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] bytes -> [n, 1] float32 of the little-endian fp16 they hold."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """[n, m] bytes -> [n, 2m] values: per group of `group` bytes, their low nibbles, then their high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _bits(b: np.ndarray, count: int) -> np.ndarray:
    """[n, count / 8] bytes -> [n, count] bits, least significant first."""
    return np.unpackbits(np.ascontiguousarray(b), axis=-1, bitorder="little")[:, :count]


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit sub-scales and 8 six-bit minimums, each [n, 8] float32."""
    n = scales.shape[0]
    d, m, m_d = np.split(scales.reshape(n, 3, 4), 3, axis=1)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1).reshape(n, 8)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1).reshape(n, 8)
    return sc.astype(np.float32), mn.astype(np.float32)


def unpack_blocks(qtype: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """GGUF blocks [n, type_size] uint8 -> (q [n, type_block] uint8 in the order of the weights, scales
    [n, type_block / block] float32, minimums of the same shape or None): w = scale * (q - zero_point) - min."""
    n = blocks.shape[0]
    if qtype in ("Q4_0", "Q4_1"):
        d = _f16(blocks[:, 0:2])
        lead = 2 if qtype == "Q4_0" else 4
        q = _nibbles(blocks[:, lead:], 16)
        return q, d, (-_f16(blocks[:, 2:4]) if qtype == "Q4_1" else None)
    if qtype in ("Q5_0", "Q5_1"):
        d = _f16(blocks[:, 0:2])
        lead = 2 if qtype == "Q5_0" else 4
        high = _bits(blocks[:, lead:lead + 4], 32)
        q = _nibbles(blocks[:, lead + 4:], 16) | (high << 4)
        return q, d, (-_f16(blocks[:, 2:4]) if qtype == "Q5_1" else None)
    if qtype == "Q8_0":
        q = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q, _f16(blocks[:, 0:2]), None
    if qtype == "Q2_K":
        scales, qs = blocks[:, :16], blocks[:, 16:80]
        d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
        q = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3  # [n, 2, 4, 32]
        return q.reshape(n, QK_K), d * (scales & 0x0F).astype(np.float32), dmin * (scales >> 4).astype(np.float32)
    if qtype == "Q3_K":
        hmask, qs, packed, d = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108], _f16(blocks[:, 108:110])
        low = (packed[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
        high = (packed[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
        sc = ((low & 0x0F) | ((high & 0x03) << 4)).astype(np.float32) - 32
        ql = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3  # [n, 2, 4, 32]
        qh = (hmask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1  # [n, 8, 32]
        q = ql.reshape(n, QK_K) + (qh.reshape(n, QK_K) << 2)  # 0..7; ggml subtracts 4 where the mask bit is clear
        return q.astype(np.uint8), d * sc, None
    if qtype in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scale_min(blocks[:, 4:16])
        if qtype == "Q4_K":
            q = _nibbles(blocks[:, 16:], 32)
        else:
            qh = (blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
            q = _nibbles(blocks[:, 48:], 32) | (qh.reshape(n, QK_K) << 4)
        return q, d * sc, dmin * mn
    if qtype == "Q6_K":
        ql, qh, scales, d = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208], _f16(blocks[:, 208:210])
        low = _nibbles(ql, 64).reshape(n, -1, 32)  # per 128 weights: ql's 64 bytes low nibbles, then high
        high = ((qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).reshape(n, -1, 32)
        q = (low | (high << 4)).reshape(n, QK_K)
        return q, d * scales.view(np.int8).astype(np.float32), None
    raise SourceError(f"GGUF type {qtype} has no exact form")


def exact_weight(qtype: str, raw: bytes, shape: tuple[int, int], name: str = "") -> QuantWeight:
    """A GGUF matrix [N, K] (numpy order: rows of K weights) of a FORMS type -> the QuantWeight that MatMulNBits
    multiplies by exactly, with its minimums (the rest of them, blocks centred) where the format has them."""
    form = FORMS.get(qtype)
    if form is None:
        raise SourceError(f"tensor {name}: GGUF type {qtype} has no exact form")
    n, k = shape
    if k % form.type_block:
        raise SourceError(f"tensor {name}: rows of {k} weights are not whole {qtype} blocks of {form.type_block}")
    blocks_per_row = k // form.type_block
    if len(raw) != n * blocks_per_row * form.type_size:
        raise SourceError(f"tensor {name}: {len(raw)} bytes where {n} rows of {qtype} need "
                          f"{n * blocks_per_row * form.type_size}")
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(n * blocks_per_row, form.type_size)
    q, scales, mins = unpack_blocks(qtype, blocks)
    q, scales = q.reshape(n, k), scales.reshape(n, -1)
    mins = mins.reshape(n, -1) if mins is not None else None
    n_blocks = k // form.block
    zp = np.full((n, n_blocks), form.zero_point, np.uint8)
    if mins is not None:
        zp, mins = _centred(scales, mins, 2 ** form.bits - 1)
    own = {"ggml_type": qtype, "ggml_blocks": blocks.reshape(n, -1)} if qtype in BLOCK_OPERATORS else {}
    return QuantWeight(packed=_pack(q.reshape(n, n_blocks, form.block), form.bits),
                       scales=np.ascontiguousarray(scales, np.float32).reshape(-1),
                       zero_points=_packed_zero_points(zp, form.bits), n=n, k=k, block_size=form.block, bits=form.bits,
                       mins=None if mins is None else np.ascontiguousarray(mins, np.float32).reshape(-1), **own)


def _packed_zero_points(zp: np.ndarray, bits: int) -> np.ndarray:
    """Zero points [N, n_blocks] uint8 -> MatMulNBits' packing, flat; 4 bits: an odd row count padded with a 0
    nibble, as quantize_blocks writes it."""
    n, nb = zp.shape
    if bits == 4 and nb % 2:
        zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
    return _pack(zp, bits).reshape(-1)


def _centred(scales: np.ndarray, mins: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block (w = s * q - min): the zero point z nearest min / s within [0, top] and the rest min - z * s, where
    that rest is exact in float32 (else z = 0 and the minimum as it was). Returns (z uint8, rest float32)."""
    s64, m64 = scales.astype(np.float64), mins.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.clip(np.rint(np.where(s64 != 0, m64 / s64, 0.0)), 0, top)
    rest = m64 - z * s64  # exact in float64: both terms are float32 numbers of few significant bits
    exact = rest.astype(np.float32).astype(np.float64) == rest
    z = np.where(exact, z, 0)
    return z.astype(np.uint8), np.where(exact, rest, m64).astype(np.float32)


def exact_from_ref(ref) -> QuantWeight | None:
    """A GGUF matrix (models.tensor_source.TensorRef) in its exact form, its loader's reordering applied; None where
    it has none: a type outside FORMS, or a reordering that splits blocks (the caller quantizes it otherwise)."""
    if ref.gguf_type not in FORMS or len(ref.shape) != 2:
        return None
    qw = exact_weight(ref.gguf_type, bytes(ref.raw()), ref.shape, ref.name)
    if ref.reorder is None:
        return qw
    return reorder_exact(qw, ref.reorder)


def reorder_exact(qw: QuantWeight, reorder) -> QuantWeight | None:
    """qw with `reorder` (a permutation of rows, or of whole blocks of columns) applied to its weights: the values,
    and the scales and minimums spread over their blocks, permuted alike; None if a block comes out mixed."""
    from specrt.convert.quantize import _unpack

    n, nb, block = qw.n, qw.k // qw.block_size, qw.block_size
    q = reorder(_unpack(qw.packed.reshape(n, nb, -1), qw.bits).reshape(n, qw.k))

    def spread(per_block: np.ndarray) -> np.ndarray | None:
        full = reorder(np.repeat(per_block.reshape(n, nb), block, axis=1)).reshape(n, nb, block)
        return full[..., 0].copy() if np.array_equal(full, np.broadcast_to(full[..., :1], full.shape)) else None

    scales = spread(qw.scales)
    mins = spread(qw.mins) if qw.mins is not None else None
    zps = spread(_unpack(qw.zero_points.reshape(n, -1), qw.bits)[:, :nb])
    if scales is None or zps is None or (qw.mins is not None and mins is None):
        return None
    own = {}
    moves = _moves(reorder, n, qw.k) if qw.ggml_blocks is not None else None
    if moves is not None and moves[1] is None:  # whole rows move: the file's blocks move with them
        own = {"ggml_type": qw.ggml_type, "ggml_blocks": qw.ggml_blocks[moves[0]]}
    elif moves is not None:  # whole columns move (rows stay): the activations will be gathered into the file's order
        own = {"ggml_type": qw.ggml_type, "ggml_blocks": qw.ggml_blocks, "ggml_columns": moves[1]}
    return QuantWeight(packed=_pack(q.reshape(n, nb, block), qw.bits), scales=scales.reshape(-1),
                       zero_points=_packed_zero_points(zps, qw.bits), n=n, k=qw.k, block_size=block, bits=qw.bits,
                       mins=None if mins is None else mins.reshape(-1), **own)


def _moves(reorder, n: int, k: int) -> tuple[np.ndarray, np.ndarray | None] | None:
    """What `reorder` does, where the file's blocks can follow: (the source row of each row, None) where it moves
    whole rows only (Llama's q/k permutation); (rows unmoved, the source column of each column) where it moves the
    same columns in every row and no row (Qwen3.5's ssm_out: value heads of 128 columns, not whole blocks of 256);
    None otherwise."""
    moved = np.asarray(reorder(np.broadcast_to(np.arange(n, dtype=np.int32)[:, None], (n, k)))).reshape(n, k)
    columns = np.asarray(reorder(np.broadcast_to(np.arange(k, dtype=np.int32)[None, :], (n, k)))).reshape(n, k)
    rows_whole = np.array_equal(moved, np.broadcast_to(moved[:, :1], moved.shape))
    columns_whole = np.array_equal(columns, np.broadcast_to(columns[:1], columns.shape))
    if not (rows_whole and columns_whole):
        return None
    if np.array_equal(columns[0], np.arange(k)):
        return moved[:, 0].copy(), None
    if np.array_equal(moved[:, 0], np.arange(n)):
        return moved[:, 0].copy(), columns[0].astype(np.int64)
    return None
