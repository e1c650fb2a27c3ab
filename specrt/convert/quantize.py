"""Weight-only block quantization (4 or 8 bits) in the layout of ONNX Runtime's MatMulNBits.

Asymmetric round-to-nearest per block of `block_size` input features, with a small search over
the clipping range per block: w ~= (q - zero_point) * scale, q and zero_point in [0, 2^bits - 1].
(Float zero points would represent GGUF Q4_1 blocks exactly, but ONNX Runtime's CPU kernel for them
took 43 ms where uint8 zero points took 0.74 ms, measured in docs/performance.md, "Precision: fp32,
int8, int4 and GGUF-exact weights", so uint8 it is.)
Layout (MatMulNBits), bits=4: B uint8 [N, n_blocks, block_size / 2] with element 2j in the low
nibble; scales [N * n_blocks]; zero points uint8 [N * ceil(n_blocks / 2)], packed the same way.
bits=8: B uint8 [N, n_blocks, block_size], one weight a byte; zero points uint8 [N * n_blocks].
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np


BITS = (4, 8)


@dataclass(frozen=True)
class QuantWeight:
    packed: np.ndarray  # uint8 [N, n_blocks, block_size * bits // 8]
    scales: np.ndarray  # float [N * n_blocks]
    zero_points: np.ndarray  # uint8 [N * ceil(n_blocks * bits / 8)]
    n: int
    k: int
    block_size: int
    bits: int = 4
    # a per-block minimum [N * n_blocks] float32, subtracted after scaling (GGUF formats such as Q4_K: w = scale *
    # (q - zero_point) - min; convert/gguf_exact.py); None for specrt's own quantization
    mins: np.ndarray | None = None
    # the same weights as the GGUF file's own blocks, where specrt's operators multiply by them (specrt/kernels/ggml_ops):
    # the type ("Q4_K") and the bytes, uint8 [N, K / block weights * block bytes]; "" / None otherwise
    ggml_type: str = ""
    ggml_blocks: np.ndarray | None = None
    # where the loader moved whole columns (Qwen3.5's ssm_out: value heads of 128 columns, which split Q4_K's blocks
    # of 256): int64 [K], HF column c is the file's column ggml_columns[c]; the product then gathers the activations
    # into the file's order instead of moving the blocks (convert/target_graph.py)
    ggml_columns: np.ndarray | None = None


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """[..., 2m] uint8 values in [0, 2^bits - 1] -> bytes: 4 bits: [..., m], even index in the low nibble;
    8 bits: as they are."""
    if bits == 8:
        return q.astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of _pack: [..., m] bytes -> [..., 2m] (4 bits) or [..., m] (8 bits) uint8 values."""
    if bits == 8:
        return packed
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


SCALE_SEARCH = np.linspace(0.70, 1.0, 13)  # shrink factors of the block's [min, max] range to try


ROW_CHUNK = 256  # rows quantized at a time: each chunk's temporaries stay in the CPU's cache


def quantize_blocks(w: np.ndarray, block_size: int = 32, search: bool = True, bits: int = 4) -> QuantWeight:
    """w [N, K] (out features x in features) -> QuantWeight of `bits` (4 or 8) bits a weight.

    Per block, the range [min, max] is shrunk around its middle by each factor in SCALE_SEARCH and
    the choice with the least squared error kept (clipping a few outliers buys finer steps; on a tie the
    first factor). Blocks lie within rows, so rows are quantized in chunks, on every core, and stacked:
    the result does not depend on the chunking.
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}")
    if w.shape[0] <= ROW_CHUNK:
        return _quantize_rows(w, block_size, search, bits)
    chunks = [w[lo:lo + ROW_CHUNK] for lo in range(0, w.shape[0], ROW_CHUNK)]
    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:  # numpy releases the GIL in its loops
        return concat_rows(list(pool.map(lambda rows: _quantize_rows(rows, block_size, search, bits), chunks)))


def _quantize_rows(w: np.ndarray, block_size: int, search: bool, bits: int) -> QuantWeight:
    n, k = w.shape
    top = float(2 ** bits - 1)
    n_blocks = -(-k // block_size)
    padded = np.zeros((n, n_blocks * block_size), dtype=np.float32)
    padded[:, :k] = w
    blocks = padded.reshape(n, n_blocks, block_size)
    lo, hi = blocks.min(-1), blocks.max(-1)  # [N, n_blocks]
    mid = (lo + hi) / 2
    errors, scales, zero_points = [], [], []
    for factor in SCALE_SEARCH if search else (1.0,):
        flo, fhi = mid + (lo - mid) * factor, mid + (hi - mid) * factor
        scale = ((fhi - flo) / top).astype(np.float32)
        scale = np.where(scale == 0, np.float32(1.0), scale)
        zp = np.clip(np.round(-flo / scale), 0, top)
        q = np.clip(np.round(blocks / scale[..., None]) + zp[..., None], 0, top)
        q -= zp[..., None]  # in place: the squared error of dequantizing q
        q *= scale[..., None]
        q -= blocks
        errors.append(np.square(q, out=q).sum(-1))
        scales.append(scale)
        zero_points.append(zp)
    best = np.argmin(np.stack(errors), axis=0)[None]  # [1, N, n_blocks]: the first least error
    scale = np.take_along_axis(np.stack(scales), best, 0)[0]
    zp = np.take_along_axis(np.stack(zero_points), best, 0)[0]
    q = np.clip(np.round(blocks / scale[..., None]) + zp[..., None], 0, top).astype(np.uint8)
    zp_padded = np.zeros((n, n_blocks + (n_blocks % 2 if bits == 4 else 0)), dtype=np.uint8)
    zp_padded[:, :n_blocks] = zp.astype(np.uint8)
    return QuantWeight(
        packed=_pack(q, bits),
        scales=scale.astype(np.float32).reshape(-1),
        zero_points=_pack(zp_padded, bits).reshape(-1),
        n=n,
        k=k,
        block_size=block_size,
        bits=bits,
    )


def concat_rows(parts: list[QuantWeight]) -> QuantWeight:
    """Stack quantized weights along N (fused QKV or gate/up); blocks are per row, so this is exact."""
    first = parts[0]
    if not same_form(parts):
        raise ValueError("can only stack quantized weights with the same K, block size, bits and minimums")
    return QuantWeight(
        packed=np.concatenate([p.packed for p in parts], axis=0),
        scales=np.concatenate([p.scales for p in parts]),
        zero_points=np.concatenate([p.zero_points for p in parts]),
        n=sum(p.n for p in parts),
        k=first.k,
        block_size=first.block_size,
        bits=first.bits,
        mins=np.concatenate([p.mins for p in parts]) if first.mins is not None else None,
        **_joined_blocks(parts),
    )


def _joined_blocks(parts: list[QuantWeight]) -> dict:
    """The parts' GGUF blocks stacked, where every part has them in one type; else none."""
    kind, columns = parts[0].ggml_type, parts[0].ggml_columns
    if not kind or any(p.ggml_type != kind or p.ggml_blocks is None for p in parts):
        return {}
    if any((p.ggml_columns is None) != (columns is None) or
           (columns is not None and not np.array_equal(p.ggml_columns, columns)) for p in parts):
        return {}  # one activation order per product
    return {"ggml_type": kind, "ggml_blocks": np.concatenate([p.ggml_blocks for p in parts], axis=0),
            "ggml_columns": columns}


def same_form(parts: list[QuantWeight]) -> bool:
    """The weights can stack into one MatMulNBits: the same K, block size and bits, minimums in all or none."""
    first = parts[0]
    return all(p.k == first.k and p.block_size == first.block_size and p.bits == first.bits
               and (p.mins is None) == (first.mins is None) for p in parts)


def is_projection(name: str) -> bool:
    """The weights that int4 and int8 turn into MatMulNBits: every linear layer and the lm_head."""
    return (name.endswith(("_proj.weight", ".per_layer_input_gate.weight", ".per_layer_projection.weight",
                           "per_layer_model_projection.weight")) or ".in_proj_" in name or name == "lm_head.weight")


def dequantize(qw: QuantWeight) -> np.ndarray:
    """Inverse of quantize_blocks: [N, K] float32 (the weights the quantized graph really multiplies by), computed
    in row chunks into one output array (a 150k-row lm_head would otherwise need several float copies)."""
    n_blocks = -(-qw.k // qw.block_size)
    packed = qw.packed.reshape(qw.n, n_blocks, qw.block_size * qw.bits // 8)
    scales = qw.scales.reshape(qw.n, n_blocks)
    zps = _unpack(qw.zero_points.reshape(qw.n, -1), qw.bits)[:, :n_blocks]
    mins = qw.mins.reshape(qw.n, n_blocks) if qw.mins is not None else None
    out = np.empty((qw.n, qw.k), dtype=np.float32)
    for lo in range(0, qw.n, ROW_CHUNK):
        hi = min(lo + ROW_CHUNK, qw.n)
        if mins is None:
            q = _unpack(packed[lo:hi], qw.bits).astype(np.float32)  # [rows, n_blocks, block_size]
            w = (q - zps[lo:hi, :, None]) * scales[lo:hi, :, None]
        else:  # the exact value of scale * (q - zp) - min (float64 holds it), rounded once to float32
            q = _unpack(packed[lo:hi], qw.bits).astype(np.float64)
            w = ((q - zps[lo:hi, :, None]) * scales[lo:hi, :, None].astype(np.float64)
                 - mins[lo:hi, :, None].astype(np.float64)).astype(np.float32)
        out[lo:hi] = w.reshape(hi - lo, -1)[:, : qw.k]
    return out
