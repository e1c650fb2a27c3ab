"""llama.cpp's Q4_K_M type mix for a synthetic GGUF, and random but valid K-quant blocks to fill it.

A real-size shape written as Q4_K_M (scripts/synthetic_gguf.py --quant q4_k_m) has the bytes, block layouts and
per-tensor types of a file `llama-quantize ... Q4_K_M` writes, so that plain decoding compares engine with engine on
the quant mix users download. Its values are random (the shape has no trained weights to quantize): each block's
packed fields are random bytes, and only its fp16 scales are set, small enough that the weights land near +-0.02
with zero mean, as trained ones do.

The type per tensor follows llama.cpp's `llama_tensor_get_type` for LLAMA_FTYPE_MOSTLY_Q4_K_M (src/llama-quant.cpp):
output.weight Q6_K (the token embedding where it is tied to the output); attn_v and ffn_down Q6_K on the layers
use_more_bits picks (the first and last eighth, every third between); a fused attn_qkv Q5_K; every other matrix Q4_K;
a matrix whose rows are not a multiple of 256 falls back to Q5_0 (Q4_K's place), Q5_1 (Q5_K's) or Q8_0 (Q6_K's); the
router (ffn_gate_inp), the conv weight and 1-D tensors stay F32.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

# Weights per block, bytes per block, and where the block's fp16 scales sit (byte offsets).
LAYOUT = {"Q4_K": (256, 144, (0, 2)), "Q5_K": (256, 176, (0, 2)), "Q6_K": (256, 210, (208,)), "Q5_0": (32, 22, (0,)),
          "Q5_1": (32, 24, (0, 2)), "Q8_0": (32, 34, (0,))}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which of n layers get the larger type in a _M mix."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class Q4KMix:
    """GGUF name + stored shape -> "F32" or the ggml type name, llama.cpp's Q4_K_M choices. n_layers counts the
    layers for ffn_down's rule; attn_v's rule counts the attn_v tensors (a hybrid's linear layers have none)."""

    def __init__(self, names: list[str], n_layers: int):
        self.n_layers = n_layers
        # tied embeddings: the token embedding is the output head, and takes its type
        self.head = "output.weight" if "output.weight" in names else "token_embd.weight"
        self.attn_v = [n for n in names if re.match(r"blk\.\d+\.attn_v\.weight$", n)]

    def __call__(self, gname: str, stored: tuple[int, ...], conv: bool = False) -> str:
        if len(stored) < 2 or conv or "ffn_gate_inp" in gname:
            return "F32"
        qtype = "Q4_K"
        layer = re.match(r"blk\.(\d+)\.", gname)
        if gname == self.head:
            qtype = "Q6_K"
        elif gname in self.attn_v and use_more_bits(self.attn_v.index(gname), len(self.attn_v)):
            qtype = "Q6_K"
        elif "ffn_down" in gname and layer and use_more_bits(int(layer.group(1)), self.n_layers):
            qtype = "Q6_K"
        elif gname.endswith("attn_qkv.weight"):  # a fused q/k/v (Qwen3.5's linear attention): one step up
            qtype = "Q5_K"
        if stored[-1] % 256:
            qtype = FALLBACK[qtype]
        return qtype


def random_blocks(gname: str, stored: tuple[int, ...], qtype: str, seed: int) -> np.ndarray:
    """uint8 [*stored[:-1], stored[-1] / per_block * block_bytes]: random packed fields, scales set (see module doc).
    Seeded by the tensor's name: the same file each time."""
    per_block, block_bytes, scale_at = LAYOUT[qtype]
    rng = np.random.default_rng([seed, zlib.crc32(gname.encode())])
    blocks = int(np.prod(stored[:-1], dtype=np.int64)) * (stored[-1] // per_block)
    data = np.frombuffer(rng.bytes(blocks * block_bytes), dtype=np.uint8).reshape(blocks, block_bytes).copy()
    # Weight spreads per unit scale: Q4_K d * sc * (q - 7.5) with sc(0..63), q(0..15) (each sub-block's minimum
    # m = sc and dmin = 7.5 d: zero mean, the minimum near minus the maximum as in a trained block), std about 169 d;
    # Q5_K the same with q(0..31) and dmin = 15.5 d, about 339 d;
    # Q6_K d * sc(-128..127) * (q - 32), about 1365 d; Q5_0 d * (q - 16), 9 d (Q5_1 d * q + m, m = -15.5 d, the
    # same); Q8_0 d * q(-128..127), 74 d.
    spread = {"Q4_K": 169.0, "Q5_K": 339.0, "Q6_K": 1365.0, "Q5_0": 9.2, "Q5_1": 9.2, "Q8_0": 74.0}[qtype]
    d = rng.uniform(0.015, 0.025, blocks) / spread
    data[:, scale_at[0]:scale_at[0] + 2] = d.astype(np.float16).view(np.uint8).reshape(blocks, 2)
    if qtype in ("Q4_K", "Q5_K"):  # 12 scale bytes: sub-blocks 0-3 sc, m in bytes 4-7, 8-11; 4-7 split across them
        mid = 7.5 if qtype == "Q4_K" else 15.5
        data[:, 2:4] = (d * mid).astype(np.float16).view(np.uint8).reshape(blocks, 2)
        data[:, 8:12] = data[:, 4:8]  # m_j = sc_j for j < 4, and the top two bits of sub-blocks 4-7 agree
        data[:, 12:16] = (data[:, 12:16] & 0x0F) * 0x11  # m_j's low nibble = sc_j's for j >= 4
    if qtype == "Q5_1":
        data[:, 2:4] = (-15.5 * d).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    return data.reshape(*stored[:-1], stored[-1] // per_block * block_bytes)


if __name__ == "__main__":  # a module for scripts/synthetic_gguf.py --quant q4_k_m: run alone, it says what it is
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(__doc__)
