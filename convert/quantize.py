"""Weight-only int4 block quantization in the layout of ONNX Runtime's MatMulNBits.

Asymmetric round-to-nearest per block of `block_size` input features (the value range always
includes zero): w ~= (q - zero_point) * scale, q and zero_point in [0, 15].
Layout (MatMulNBits, bits=4): B uint8 [N, n_blocks, block_size / 2] with element 2j in the low
nibble; scales [N * n_blocks]; zero points uint8 [N * ceil(n_blocks / 2)], packed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Int4Weight:
    packed: np.ndarray  # uint8 [N, n_blocks, block_size // 2]
    scales: np.ndarray  # float [N * n_blocks]
    zero_points: np.ndarray  # uint8 [N * ceil(n_blocks / 2)]
    n: int
    k: int
    block_size: int


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[..., 2m] uint8 values in [0, 15] -> [..., m] bytes, even index in the low nibble."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def quantize_int4(w: np.ndarray, block_size: int = 32) -> Int4Weight:
    """w [N, K] (out features x in features) -> Int4Weight."""
    n, k = w.shape
    n_blocks = -(-k // block_size)
    padded = np.zeros((n, n_blocks * block_size), dtype=np.float32)
    padded[:, :k] = w
    blocks = padded.reshape(n, n_blocks, block_size)
    lo = np.minimum(blocks.min(-1), 0.0)
    hi = np.maximum(blocks.max(-1), 0.0)
    scale = (hi - lo) / 15.0
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    zp = np.clip(np.round(-lo / scale), 0, 15).astype(np.uint8)  # [N, n_blocks]
    q = np.clip(np.round(blocks / scale[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    zp_padded = np.zeros((n, n_blocks + (n_blocks % 2)), dtype=np.uint8)
    zp_padded[:, :n_blocks] = zp
    return Int4Weight(
        packed=_pack_nibbles(q),
        scales=scale.reshape(-1),
        zero_points=_pack_nibbles(zp_padded).reshape(-1),
        n=n,
        k=k,
        block_size=block_size,
    )


def dequantize_int4(qw: Int4Weight) -> np.ndarray:
    """Inverse of quantize_int4 (for tests): [N, K] float32."""
    lo = qw.packed & 0x0F
    hi = qw.packed >> 4
    q = np.stack([lo, hi], axis=-1).reshape(qw.n, -1, qw.block_size).astype(np.float32)
    n_blocks = q.shape[1]
    zps = np.stack([qw.zero_points & 0x0F, qw.zero_points >> 4], -1).reshape(qw.n, -1)[:, :n_blocks]
    scales = qw.scales.reshape(qw.n, n_blocks)
    w = (q - zps[..., None]) * scales[..., None]
    return w.reshape(qw.n, -1)[:, : qw.k]
