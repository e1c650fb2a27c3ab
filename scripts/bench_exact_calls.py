"""What exact (batch-invariant) one-token calls cost, three ways, side by side: a one-token call as plain decoding
makes it, the same call with its attention on two rows (graphs with the attention_min_rows input), and the whole
call padded to two rows (what batch-invariant mode does on graphs without that input). Calls interleaved, median ms.
Usage: python scripts/bench_exact_calls.py BUNDLE [--past 64,512,1024] [--reps 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import specrt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--past", default="64,512,1024")
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    engine = specrt.load(args.bundle, device="cpu", drafter="none")
    target = engine.target
    ways = {"one row": (1, 1), "attention on 2 rows": (2, 1), "call padded to 2 rows": (1, 2)}
    if not target.has_attention_rows:
        del ways["attention on 2 rows"]
    print(f"{args.bundle}: median ms of a one-token call ({args.reps} interleaved calls each)")
    print("| past | " + " | ".join(ways) + " |\n|---|" + "---|" * len(ways))
    rng = np.random.default_rng(0)
    for past in (int(p) for p in args.past.split(",")):
        target.reset()
        for lo in range(0, past, 256):
            target.forward(rng.integers(0, engine.manifest.vocab_size, (1, min(256, past - lo))))
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.reps):
            for way, (attention_rows, min_rows) in ways.items():
                target.attention_min_rows, target.min_rows = attention_rows, min_rows
                t = time.perf_counter()
                target.forward(np.array([[7]]))
                times[way].append(time.perf_counter() - t)
                target.rollback(past)
        base = statistics.median(times["one row"])
        cells = [f"{statistics.median(t) * 1e3:.2f} ({statistics.median(t) / base:.2f}x)" for t in times.values()]
        print(f"| {past} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
