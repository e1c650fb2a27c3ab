"""Fused lossless verification in Triton: one program per request walks its draft tree on the device.

Semantics, argument shapes and the random-number convention are those of the twin, kernels/verify_ref.py
(read its docstring first). Per request the program, at each node of the accepted path:
- greedy (temperature 0): takes the row's argmax in blocks over the vocabulary (first index on ties) and
  looks for a child drafting it;
- sampling: builds the row's target distribution in a scratch row (temperature; top-k and top-p as logit
  thresholds found by bisection, each step one masked pass over the row; softmax), tries the children in
  order (accept iff u < p[x] / q[x], else p <- normalize(max(p - q, 0)) in place), and after a rejection
  of all children or at a leaf draws the recovered / bonus token by the exponential race argmax(p / e).
Nothing goes back to the host inside the walk; the outputs are three small tensors.

`verify_tree` dispatches on the logits' device: Triton on CUDA (ROCm's torch also says cuda) or under
TRITON_INTERPRET=1, the numpy twin for CPU tensors and numpy arrays.
"""

from __future__ import annotations

import os

import numpy as np

from specrt.kernels.verify_ref import verify_tree_ref

BLOCK = 1024
BISECT_STEPS = 48

try:  # triton is optional: the CPU runtime needs only the twin
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None


if triton is not None:

    @triton.jit
    def _row_max(row_ptr, V, scale, lo_keep, BLOCK: tl.constexpr):
        m = -float("inf")
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < V, other=0.0).to(tl.float32) * scale
            x = tl.where((x >= lo_keep) & (offs < V), x, -float("inf"))
            m = tl.maximum(m, tl.max(x, axis=0))
        return m

    @triton.jit
    def _row_argmax(row_ptr, V, BLOCK: tl.constexpr):
        best = -float("inf")
        best_idx = 0
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
            bm = tl.max(x, axis=0)
            bi = tl.min(tl.where(x == bm, offs, V), axis=0)  # first index of the block's maximum
            take = bm > best  # strictly: an earlier block keeps a tie
            best_idx = tl.where(take, bi, best_idx)
            best = tl.where(take, bm, best)
        return best_idx

    @triton.jit
    def _count_at_least(row_ptr, V, scale, t, BLOCK: tl.constexpr):
        n = 0
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32) * scale
            n += tl.sum((x >= t).to(tl.int32), axis=0)
        return n

    @triton.jit
    def _mass_above(row_ptr, V, scale, lo_keep, m, t, BLOCK: tl.constexpr):
        """sum of exp(x - m) over kept tokens with x > t."""
        s = 0.0
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32) * scale
            keep = (x >= lo_keep) & (x > t) & (offs < V)
            s += tl.sum(tl.where(keep, tl.exp(x - m), 0.0), axis=0)
        return s

    @triton.jit
    def _target_row(row_ptr, work_ptr, V, temperature, top_k, top_p, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        """work[:V] <- the target distribution of one logits row (temperature > 0, top-k, top-p)."""
        scale = 1.0 / temperature
        neg = -float("inf")
        m = _row_max(row_ptr, V, scale, neg, BLOCK)
        lo_keep = neg
        if top_k > 0 and top_k < V:  # largest t with count(x >= t) >= k: the k-th largest logit
            lo = -_row_max(row_ptr, V, -scale, neg, BLOCK)  # the minimum
            hi = m + 1.0
            for _ in range(STEPS):
                mid = lo + (hi - lo) * 0.5
                enough = _count_at_least(row_ptr, V, scale, mid, BLOCK) >= top_k
                lo = tl.where(enough, mid, lo)
                hi = tl.where(enough, hi, mid)
            lo_keep = lo
        z = _mass_above(row_ptr, V, scale, lo_keep, m, neg, BLOCK)
        cut = neg  # top-p: keep x > cut, where cut = sup{t : mass(x > t) >= top_p}
        if top_p < 1.0:
            lo = m - 200.0  # all kept mass lies above (exp(-200) is 0 in float32)
            hi = m
            for _ in range(STEPS):
                mid = lo + (hi - lo) * 0.5
                enough = _mass_above(row_ptr, V, scale, lo_keep, m, mid, BLOCK) >= top_p * z
                lo = tl.where(enough, mid, lo)
                hi = tl.where(enough, hi, mid)
            cut = lo
            z = _mass_above(row_ptr, V, scale, lo_keep, m, cut, BLOCK)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32) * scale
            keep = (x >= lo_keep) & (x > cut)
            tl.store(work_ptr + offs, tl.where(keep, tl.exp(x - m) / z, 0.0), mask=offs < V)

    @triton.jit
    def _residual_block(work_ptr, q_ptr, x, has_q, offs, V):
        """max(p - q, 0) over one block (q one-hot at x without has_q)."""
        p = tl.load(work_ptr + offs, mask=offs < V, other=0.0)
        if has_q:
            q = tl.load(q_ptr + offs, mask=offs < V, other=0.0).to(tl.float32)
        else:
            q = tl.where(offs == x, 1.0, 0.0)
        return tl.maximum(p - q, 0.0)

    @triton.jit
    def _reject(work_ptr, q_ptr, x, has_q, V, BLOCK: tl.constexpr):
        """work <- normalize(max(work - q, 0)) unless that is all zero (q one-hot at x without has_q)."""
        s = 0.0
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            s += tl.sum(_residual_block(work_ptr, q_ptr, x, has_q, offs, V), axis=0)
        if s > 0:
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                tl.store(work_ptr + offs, _residual_block(work_ptr, q_ptr, x, has_q, offs, V) / s, mask=offs < V)

    @triton.jit
    def _race(work_ptr, noise_ptr, V, BLOCK: tl.constexpr):
        best = -2.0
        best_idx = 0
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            p = tl.load(work_ptr + offs, mask=offs < V, other=0.0)
            e = tl.load(noise_ptr + offs, mask=offs < V, other=1.0)
            score = tl.where((p > 0) & (offs < V), p / e, -1.0)
            bm = tl.max(score, axis=0)
            bi = tl.min(tl.where(score == bm, offs, V), axis=0)
            take = bm > best
            best_idx = tl.where(take, bi, best_idx)
            best = tl.where(take, bm, best)
        return best_idx

    @triton.jit
    def _verify_kernel(logits_ptr, tokens_ptr, parents_ptr, num_draft_ptr, probs_ptr, temp_ptr, topk_ptr, topp_ptr,
                       u_ptr, noise_ptr, work_ptr, accepted_ptr, count_ptr, next_ptr,
                       K, V, HAS_PROBS: tl.constexpr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        b = tl.program_id(0)
        n = tl.load(num_draft_ptr + b).to(tl.int32)
        temperature = tl.load(temp_ptr + b).to(tl.float32)
        top_k = tl.load(topk_ptr + b).to(tl.int32)
        top_p = tl.load(topp_ptr + b).to(tl.float32)
        work = work_ptr + b * V
        noise = noise_ptr + b * V
        node = -1
        row = 0
        count = 0
        done = False
        next_token = 0
        for _ in range(0, K + 1):  # at most K tokens accepted, then one more row decides
            if not done:
                row_ptr = logits_ptr + (b * (K + 1) + row) * V
                match = -1
                if temperature == 0.0:
                    choice = _row_argmax(row_ptr, V, BLOCK)
                    for c in range(0, n):
                        parent = tl.load(parents_ptr + b * K + c).to(tl.int32)
                        tok = tl.load(tokens_ptr + b * K + c).to(tl.int32)
                        if match < 0 and parent == node and tok == choice:
                            match = c
                    next_token = choice
                else:
                    _target_row(row_ptr, work, V, temperature, top_k, top_p, BLOCK, STEPS)
                    for c in range(0, n):
                        parent = tl.load(parents_ptr + b * K + c).to(tl.int32)
                        if match < 0 and parent == node:
                            x = tl.load(tokens_ptr + b * K + c).to(tl.int32)
                            px = tl.load(work + x)
                            qx = 1.0
                            if HAS_PROBS:
                                qx = tl.load(probs_ptr + (b * K + c) * V + x).to(tl.float32)
                            u = tl.load(u_ptr + b * K + c).to(tl.float32)
                            if qx > 0 and u * qx < px:
                                match = c
                            else:
                                _reject(work, probs_ptr + (b * K + c) * V, x, HAS_PROBS, V, BLOCK)
                    if match < 0:
                        next_token = _race(work, noise, V, BLOCK)
                if match < 0:
                    done = True
                else:
                    tl.store(accepted_ptr + b * K + count, match)
                    count += 1
                    node = match
                    row = match + 1
        tl.store(count_ptr + b, count)
        tl.store(next_ptr + b, next_token)


if triton is not None:

    @triton.jit
    def _probs_kernel(logits_ptr, temp_ptr, topk_ptr, topp_ptr, out_ptr, V, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        r = tl.program_id(0)
        _target_row(logits_ptr + r * V, out_ptr + r * V, V, tl.load(temp_ptr + r).to(tl.float32),
                    tl.load(topk_ptr + r).to(tl.int32), tl.load(topp_ptr + r).to(tl.float32), BLOCK, STEPS)


def target_probs_triton(logits, temperature, top_k, top_p):
    """logits [R, V] -> the sampling distribution of each row [R, V] (float32); temperature, top_p [R] > 0,
    top_k [R] (0: off). The rows the verification kernel builds, exposed for sampling and for tests."""
    import torch

    r, v = logits.shape
    out = torch.empty((r, v), dtype=torch.float32, device=logits.device)
    _probs_kernel[(r,)](logits.contiguous(), temperature.contiguous(), top_k.contiguous(), top_p.contiguous(), out, v,
                        BLOCK=BLOCK, STEPS=BISECT_STEPS)
    return out


def verify_tree_triton(logits, tokens, parents, num_draft, draft_probs, temperature, top_k, top_p, uniforms, exp_noise):
    """Same contract as verify_tree_ref, on torch tensors (CUDA, or CPU under TRITON_INTERPRET=1)."""
    import torch

    if triton is None:
        raise RuntimeError("triton is not installed (pip install 'specrt[nvidia]' or 'specrt[amd]')")
    b, k = tokens.shape
    v = logits.shape[-1]
    dev = logits.device
    logits = logits.contiguous()
    work = torch.empty((b, v), dtype=torch.float32, device=dev)
    accepted = torch.full((b, k), -1, dtype=torch.int64, device=dev)
    count = torch.zeros(b, dtype=torch.int64, device=dev)
    next_token = torch.zeros(b, dtype=torch.int64, device=dev)
    probs = draft_probs.contiguous() if draft_probs is not None else work  # unused when HAS_PROBS is False
    _verify_kernel[(b,)](
        logits, tokens.contiguous(), parents.contiguous(), num_draft.contiguous(), probs,
        temperature.contiguous(), top_k.contiguous(), top_p.contiguous(), uniforms.contiguous(),
        exp_noise.contiguous(), work, accepted, count, next_token, k, v,
        HAS_PROBS=draft_probs is not None, BLOCK=BLOCK, STEPS=BISECT_STEPS,
    )
    return accepted, count, next_token


def _on_triton_device(x) -> bool:
    if not hasattr(x, "device") or isinstance(x, np.ndarray):
        return False
    return x.device.type == "cuda" or (os.environ.get("TRITON_INTERPRET") == "1" and triton is not None)


def verify_tree(logits, *args):
    """Dispatch: Triton where the logits live on a GPU, the numpy twin for host memory."""
    if _on_triton_device(logits):
        return verify_tree_triton(logits, *args)
    as_np = [a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a for a in (logits, *args)]
    return verify_tree_ref(*as_np)
