"""gpt-oss's checkpoint layout read as per-expert tensors, so that its experts convert as any other MoE's.

A gpt-oss checkpoint keeps each layer's experts fused: the router as `mlp.router.{weight, bias}`, and either
(transformers' bf16 form) `mlp.experts.gate_up_proj` [E, H, 2I] (gate and up interleaved along the last axis: gate
column r at 2r, up at 2r + 1), `gate_up_proj_bias` [E, 2I], `down_proj` [E, I, H], `down_proj_bias` [E, H]; or
(the published MXFP4 form) `gate_up_proj_blocks` [E, 2I, H / 32, 16] uint8 with `gate_up_proj_scales` [E, 2I, H / 32]
uint8 and `down_proj_blocks` [E, H, I / 32, 16] with `down_proj_scales`, beside the same biases. MXFP4: 32 values a
block, each an e2m1 nibble (low nibble first) from FP4_VALUES, times 2^(scale - 127); transformers' own dequantizer
(integrations/mxfp4.py) reads them so, and the dequantized [E, 2I, H] rows are the bf16 form's columns.

`expert_view` renames the router to `mlp.gate.*` and gives every expert j `mlp.experts.{j}.{gate,up,down}_proj.
{weight,bias}` in nn.Linear's [out, in] layout, each read from that expert's own bytes (the leading axis is the
expert: its slice is contiguous) when used; MXFP4 weights are dequantized exactly (every e2m1 value times a power
of two is a float32).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from specrt.errors import SourceError
from specrt.models.tensor_source import TensorRef

FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.)experts\.(gate_up_proj|down_proj)(_blocks)?$")


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> float32 [..., G * 32]."""
    out = np.empty(blocks.shape[:-1] + (32,), dtype=np.float32)
    out[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    out[..., 1::2] = FP4_VALUES[blocks >> 4]
    out = np.ldexp(out, scales.astype(np.int32)[..., None] - 127)
    return out.reshape(blocks.shape[:-2] + (-1,))


def _expert_ref(ref: TensorRef, expert: int, shape: tuple[int, ...], take) -> TensorRef:
    """Expert `expert`'s slice of a fused [E, ...] tensor, decoded then cut by take(array) to `shape`."""
    stored = tuple(ref.shape[1:])

    def read(raw, _shape):
        return np.ascontiguousarray(take(ref.decode(raw, stored).reshape(stored)), dtype=np.float32)

    return ref.expert(expert, shape, read, rows_apart=False)


def _mxfp4_ref(blocks: TensorRef, scales: TensorRef, expert: int, shape: tuple[int, ...], take) -> TensorRef:
    """Expert `expert`'s MXFP4 matrix, dequantized (its scales read beside its blocks) and cut by take."""
    scale_ref = scales.expert(expert, scales.shape[1:])

    def read(raw, _shape):
        b = np.frombuffer(raw, dtype=np.uint8).reshape(blocks.shape[1:])
        s = np.frombuffer(scale_ref._pread(scale_ref.offset, scale_ref.nbytes), dtype=np.uint8).reshape(
            scales.shape[1:])
        return np.ascontiguousarray(take(dequantize_mxfp4(b, s)))

    return dataclasses.replace(blocks.expert(expert, shape, read, rows_apart=False), dtype="MXFP4")


def expert_view(refs: dict[str, TensorRef]) -> dict[str, TensorRef]:
    """A gpt-oss checkpoint's tensors with the router and experts under per-expert names (see the module's
    docstring); a fused tensor of the wrong rank, or MXFP4 blocks without their scales, is named in one line."""
    out = {}
    for name, ref in refs.items():
        if ".mlp.router." in name:
            out[name.replace(".mlp.router.", ".mlp.gate.")] = ref
            continue
        m = _FUSED.match(name)
        if m is None:
            if not re.search(r"\.mlp\.experts\.(gate_up_proj|down_proj)_(bias|scales)$", name):
                out[name] = ref
            continue
        p, which, mxfp4 = m.group(1), m.group(2), bool(m.group(3))
        experts = ref.shape[0]
        bias = refs.get(f"{p}experts.{which}_bias")
        if mxfp4:
            scales = refs.get(f"{p}experts.{which}_scales")
            if scales is None:
                raise SourceError(f"tensor {name} has no {p}experts.{which}_scales beside it (MXFP4 needs both)")
            if len(ref.shape) != 4 or ref.shape[-1] != 16 or tuple(scales.shape) != tuple(ref.shape[:3]):
                raise SourceError(f"tensor {name} has shape {ref.shape} and its scales {scales.shape}: MXFP4 blocks "
                                  "are [experts, rows, blocks, 16] with scales [experts, rows, blocks]")
            rows, width = ref.shape[1], ref.shape[2] * 32  # dequantized: [rows, width] = nn.Linear's [out, in]
        else:
            if len(ref.shape) != 3:
                raise SourceError(f"tensor {name} has shape {ref.shape}, expected [experts, in, out]")
            width, rows = ref.shape[1], ref.shape[2]  # stored [in, out]: transposed below
        for e in range(experts):
            q = f"{p}experts.{e}."
            if which == "gate_up_proj":
                parts = (("gate_proj", 0), ("up_proj", 1))
            else:
                parts = (("down_proj", None),)
            for proj, half in parts:
                n = rows // 2 if half is not None else rows
                pick = (slice(half, None, 2) if half is not None else slice(None))
                if mxfp4:
                    out[q + proj + ".weight"] = _mxfp4_ref(ref, scales, e, (n, width),
                                                           lambda w, pick=pick: w[pick])
                else:
                    out[q + proj + ".weight"] = _expert_ref(ref, e, (n, width),
                                                            lambda w, pick=pick: w[:, pick].T)
                if bias is not None:
                    out[q + proj + ".bias"] = _expert_ref(bias, e, (n,),
                                                          lambda b, pick=pick: b[pick])
    return out
