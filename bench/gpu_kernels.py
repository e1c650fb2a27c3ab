"""Time the fused Triton verification kernel (kernels/verify.py) against the bytes it must read.

Per configuration (draft length K, greedy or sampled): the kernel reads the target's logits for the K draft
positions and the bonus position ([K + 1, V], in the logits' dtype) and, when sampling, the draft distributions
([K, V] float32). Reported: median time per call over many calls (CUDA events), those bytes, and the bandwidth
they imply. Usage: python bench/gpu_kernels.py --vocab 49152 [--device cuda] [--json OUT]
(On the CPU, TRITON_INTERPRET=1 python bench/gpu_kernels.py --device cpu --iters 2 checks the script runs.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specrt.kernels.verify import verify_tree_triton


def _inputs(k: int, v: int, sampled: bool, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(k)
    logits = torch.randn((1, k + 1, v), generator=g).to(dtype).to(device)
    tokens = torch.randint(0, v, (1, k), generator=g).to(device)
    parents = (torch.arange(k) - 1).view(1, k).to(device)
    probs = torch.softmax(torch.randn((1, k, v), generator=g), -1).to(device) if sampled else None
    temp = torch.tensor([0.8 if sampled else 0.0], device=device)
    top_k = torch.tensor([0], device=device)
    top_p = torch.tensor([1.0], device=device)
    uniforms = torch.rand((1, k + 1), generator=g).to(device)
    noise = torch.empty((1, v)).exponential_(generator=g).to(device)
    args = (logits, tokens, parents, torch.tensor([k], device=device), probs, temp, top_k, top_p, uniforms, noise)
    read = logits.numel() * logits.element_size() + (probs.numel() * 4 if sampled else 0)
    return args, read


def time_kernel(k: int, v: int, sampled: bool, dtype, device: str, iters: int) -> dict:
    args, read = _inputs(k, v, sampled, dtype, device)
    verify_tree_triton(*args)  # compile
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            verify_tree_triton(*args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            verify_tree_triton(*args)
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {"draft_len": k, "vocab": v, "sampled": sampled, "dtype": str(dtype).removeprefix("torch."),
            "median_us": round(t * 1e6, 2), "bytes_read": read, "gb_per_s": round(read / t / 1e9, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    for dtype in (torch.float16, torch.float32):
        for sampled in (False, True):
            for k in (1, 4, 8):
                rows.append(time_kernel(k, a.vocab, sampled, dtype, a.device, a.iters))
                r = rows[-1]
                print(f"K={k} {'sampled' if sampled else 'greedy '} {r['dtype']:>7}: {r['median_us']:9.1f} us, "
                      f"{r['bytes_read'] / 1e6:6.2f} MB read, {r['gb_per_s']:7.1f} GB/s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if a.device == "cuda" else a.device, "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
