"""Compact an accepted tree path in the KV cache: slots src[0], src[1], ... move to dst, dst + 1, ...

A tree's verified tokens sit in slots base + 1 + i (draft order); the accepted path is a subsequence, so
after verification its keys/values are gathered into contiguous slots right after the pending token and
the cache length is set past them (rolling back the rest). One launch per buffer [B, H, S, D]: a program per
(batch, head) row copies the path's slots in increasing order, which is safe in place because
src[i] >= dst + i and src is increasing (a slot is read before any later write can reach it).

`kv_compact(buffer, dst, src)` dispatches on where the buffer lives: Triton on CUDA (or any torch tensor
under TRITON_INTERPRET=1), the numpy twin `kv_compact_ref` for host arrays.
"""

from __future__ import annotations

import os

import numpy as np

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def kv_compact_ref(buffer: np.ndarray, dst: int, src: np.ndarray) -> None:
    """buffer [B, H, S, D] (numpy, in place); src [n] increasing slots with src[i] >= dst + i."""
    src = np.asarray(src, dtype=np.int64)
    buffer[:, :, dst:dst + len(src)] = buffer[:, :, src]  # fancy indexing copies before writing


if triton is not None:

    @triton.jit
    def _compact_kernel(buf_ptr, src_ptr, n, dst, S, D, BLOCK_D: tl.constexpr):
        row = tl.program_id(0)  # one (batch, head) row of S slots x D
        base = buf_ptr + row.to(tl.int64) * S * D
        offs = tl.arange(0, BLOCK_D)
        for i in range(0, n):
            s = tl.load(src_ptr + i)
            for d0 in range(0, D, BLOCK_D):
                vals = tl.load(base + s * D + d0 + offs, mask=d0 + offs < D)
                tl.store(base + (dst + i) * D + d0 + offs, vals, mask=d0 + offs < D)


def kv_compact_triton(buffer, dst: int, src) -> None:
    """buffer: torch tensor [B, H, S, D] (contiguous); src: int64 tensor [n] on the same device."""
    if triton is None:
        raise RuntimeError("triton is not installed (pip install 'specrt[nvidia]' or 'specrt[amd]')")
    b, h, s, d = buffer.shape
    if not buffer.is_contiguous():
        raise ValueError("the KV buffer must be contiguous")
    block = min(128, triton.next_power_of_2(d))
    _compact_kernel[(b * h,)](buffer, src, len(src), dst, s, d, BLOCK_D=block)


def kv_compact(buffer, dst: int, src) -> None:
    if isinstance(buffer, np.ndarray):
        return kv_compact_ref(buffer, dst, src)
    if buffer.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return kv_compact_triton(buffer, dst, src)
    kv_compact_ref(buffer.numpy(), dst, np.asarray(src))
