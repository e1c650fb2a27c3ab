"""Replay a Gated DeltaNet layer's recurrent state over the accepted prefix of a verification call.

A verification call of a hybrid target (Qwen3.5/3.6) captures, per token, the transition its GatedDeltaNet applied
(convert/linear_attention_graph.py; ONNX Runtime's state_update_capacity): a decay per value head, a key per key
head and a delta per value head. The state after the first `kept` tokens is rebuilt from the state before the call:

    for t < kept:  S[h] *= decay[t, h];  S[h] += delta[t, h] (x) key[t, h // groups]      S[h]: [Dv, Dk], float32

`replay_recurrent_ref` is the numpy twin (stepped as the op steps, so the replayed state equals the op's own bit for
bit on the CPU); `replay_recurrent_triton` is the kernel for a state that lives on the GPU (one program per batch row,
value head and block of Dv rows; no host round trip). `replay_recurrent` dispatches on where the state lives: Triton
on CUDA (or under TRITON_INTERPRET=1 for torch tensors), the twin for numpy arrays. The conv state needs no kernel:
it is the last K - 1 rows of (state before, the call's inputs[:kept]), `replay_conv` for both.

Capture layout per batch row: [capacity * Hv decays | capacity * Hk * Dk keys | capacity * Hv * Dv deltas].
"""

from __future__ import annotations

import os

import numpy as np

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def split_capture(row: np.ndarray, capacity: int, hv: int, hk: int, dk: int, dv: int):
    """One batch row's capture [capacity * (Hv + Hk * Dk + Hv * Dv)] -> decay [cap, Hv], key [cap, Hk, Dk],
    delta [cap, Hv, Dv]."""
    a, b = capacity * hv, capacity * hv + capacity * hk * dk
    return row[:a].reshape(capacity, hv), row[a:b].reshape(capacity, hk, dk), row[b:].reshape(capacity, hv, dv)


def replay_recurrent_ref(before: np.ndarray, capture: np.ndarray, kept: int, capacity: int, key_heads: int,
                         out: np.ndarray) -> None:
    """before [B, Hv, Dv, Dk] float32; capture [B, capacity * (...)]; writes the state after `kept` transitions into
    out [B, Hv, Dv, Dk], token by token in float32 (S *= decay; S += delta (x) key, in that order)."""
    _, hv, dv, dk = before.shape
    groups = hv // key_heads  # value head h reads key head h // groups
    for b in range(before.shape[0]):
        decay, key, delta = split_capture(capture[b], capacity, hv, key_heads, dk, dv)
        out[b] = before[b]
        for t in range(kept):
            np.multiply(out[b], decay[t][:, None, None], out=out[b])
            keys = np.repeat(key[t], groups, axis=0)  # [Hv, Dk]
            out[b] += delta[t][:, :, None] * keys[:, None, :]  # [Hv, Dv, 1] x [Hv, 1, Dk]


def replay_conv(before, inputs, kept: int, out) -> None:
    """before [B, K - 1, C]; inputs [B, S, C]; writes the conv state after `kept` inputs into out [B, K - 1, C]
    (numpy arrays or torch tensors alike)."""
    width = before.shape[1]
    if kept >= width:
        out[...] = inputs[:, kept - width:kept]
    else:
        out[:, :width - kept] = before[:, kept:]  # before and out are two buffers (the ping-pong pair)
        out[:, width - kept:] = inputs[:, :kept]


if triton is not None:

    @triton.jit
    def _replay_kernel(before_ptr, capture_ptr, out_ptr, kept, capacity, HV, HK, DV, DK, row_stride,
                       BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        v0 = tl.program_id(2) * BLOCK_V
        rows = v0 + tl.arange(0, BLOCK_V)  # [BLOCK_V] value rows
        cols = tl.arange(0, BLOCK_K)  # [BLOCK_K] key columns
        inside = (rows[:, None] < DV) & (cols[None, :] < DK)
        offs = ((b * HV + h) * DV + rows[:, None]).to(tl.int64) * DK + cols[None, :]
        state = tl.load(before_ptr + offs, mask=inside, other=0.0)  # [BLOCK_V, BLOCK_K] float32
        row = capture_ptr + b.to(tl.int64) * row_stride
        keys_at = capacity * HV
        deltas_at = keys_at + capacity * HK * DK
        kh = h // (HV // HK)
        for t in range(0, kept):
            decay = tl.load(row + t * HV + h)
            key = tl.load(row + keys_at + (t * HK + kh) * DK + cols, mask=cols < DK, other=0.0)
            delta = tl.load(row + deltas_at + (t * HV + h) * DV + rows, mask=rows < DV, other=0.0)
            state = state * decay
            state = state + delta[:, None] * key[None, :]
        tl.store(out_ptr + offs, state, mask=inside)


def replay_recurrent_triton(before, capture, kept: int, capacity: int, key_heads: int, out) -> None:
    """The kernel: before, out torch float32 [B, Hv, Dv, Dk] (contiguous); capture [B, capacity * (...)]."""
    if triton is None:
        raise RuntimeError("triton is not installed (pip install 'specrt[nvidia]' or 'specrt[amd]')")
    b, hv, dv, dk = before.shape
    if not (before.is_contiguous() and out.is_contiguous() and capture.is_contiguous()):
        raise ValueError("the states and the capture must be contiguous")
    block_v = min(32, triton.next_power_of_2(dv))
    grid = (b, hv, triton.cdiv(dv, block_v))
    _replay_kernel[grid](before, capture, out, kept, capacity, hv, key_heads, dv, dk, capture.shape[1],
                         BLOCK_V=block_v, BLOCK_K=triton.next_power_of_2(dk))


def replay_recurrent(before, capture, kept: int, capacity: int, key_heads: int, out) -> None:
    """Where the state lives decides: numpy -> the twin; a torch tensor on CUDA (or under TRITON_INTERPRET=1) ->
    the kernel; a torch tensor on the CPU otherwise -> the twin over its memory."""
    if isinstance(before, np.ndarray):
        return replay_recurrent_ref(before, capture, kept, capacity, key_heads, out)
    if before.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return replay_recurrent_triton(before, capture, kept, capacity, key_heads, out)
    replay_recurrent_ref(before.numpy(), capture.numpy(), kept, capacity, key_heads, out.numpy())
