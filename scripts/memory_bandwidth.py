"""Measure this machine's memory bandwidth, and the decode-speed bound it sets for a bundle.

    python scripts/memory_bandwidth.py [--gib 2] [--bundle BUNDLE] [--threads N]

A decode step of a memory-bound model reads every weight once, so tokens/s <= bandwidth / bytes read per
step. Bandwidth: the best of several passes over a buffer much larger than the caches, read-only (a sum over
it, split across threads, as a matmul kernel reads its weights) and copy (numpy's copyto: read + write).
Bytes per step: the target graph's initializers except the embedding table (a step gathers only its rows).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

GB = 1e9


def bandwidth(gib: float, threads: int, repeats: int = 5) -> dict:
    n = int(gib * (1 << 30)) // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    parts = np.array_split(src, threads)
    best_read = best_copy = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))  # numpy releases the GIL: the threads read in parallel
            best_read = max(best_read, src.nbytes / (time.perf_counter() - t))
            t = time.perf_counter()
            np.copyto(dst, src)
            best_copy = max(best_copy, 2 * src.nbytes / (time.perf_counter() - t))
    return {"read_gb_s": round(best_read / GB, 2), "copy_gb_s": round(best_copy / GB, 2), "buffer_gib": gib,
            "threads": threads}


def step_bytes(bundle: Path) -> int:
    """Bytes of the target's initializers a decode step reads (all but the embedding table)."""
    import onnx

    manifest = json.loads((bundle / "specrt.json").read_text())
    model = onnx.load(str(bundle / manifest["target"]["file"]), load_external_data=False)
    total = 0
    for t in model.graph.initializer:
        if t.name.startswith("model.embed_tokens"):
            continue
        length = next((int(e.value) for e in t.external_data if e.key == "length"), None)
        total += length if length is not None else len(t.raw_data)
    return total


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bundle", type=Path)
    args = ap.parse_args(argv)
    report = bandwidth(args.gib, args.threads)
    if args.bundle:
        b = step_bytes(args.bundle)
        best = max(report["read_gb_s"], report["copy_gb_s"] / 2) * GB
        report.update(bundle=str(args.bundle), step_gb=round(b / GB, 3),
                      bound_tokens_per_s=round(best / b, 2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
