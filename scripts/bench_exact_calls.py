"""What exact (batch-invariant) calls cost, side by side: a call as plain decoding makes it, the same call with its
attention on two rows and computed call-invariantly (graphs with the attention_min_rows input;
convert/exact_attention.py), and the whole call padded to two rows (what batch-invariant mode does on graphs without
that input). One-token calls and, with --tokens, calls of more tokens (a verification). With --compare, a second
bundle of the same model (e.g. one converted before exact attention) is timed in the same loop. Calls interleaved,
median ms.
Usage: python scripts/bench_exact_calls.py BUNDLE [--compare OTHER] [--past 64,512,1024] [--tokens 1,4] [--reps 40]
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
    ap.add_argument("--compare")
    ap.add_argument("--past", default="64,512,1024")
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    bundles = {"A": args.bundle} | ({"B": args.compare} if args.compare else {})
    targets = {k: specrt.load(b, device="cpu", drafter="none").target for k, b in bundles.items()}
    vocab = specrt.load(args.bundle, device="cpu", drafter="none").manifest.vocab_size
    ways = {"plain": (1, 1), "attention on 2 rows": (2, 1), "call padded to 2 rows": (1, 2)}
    cols = [(k, w) for k in targets for w in ways if targets[k].has_attention_rows or w != "attention on 2 rows"]
    print("; ".join(f"{k} = {b}" for k, b in bundles.items()) + f": median ms of a call ({args.reps} interleaved each)")
    print("| past | tokens | " + " | ".join(f"{k} {w}" for k, w in cols) + " |\n|---|---|" + "---|" * len(cols))
    rng = np.random.default_rng(0)
    for past in (int(p) for p in args.past.split(",")):
        prefix = rng.integers(0, vocab, (1, past))
        for t in targets.values():
            t.reset()
            for lo in range(0, past, 256):
                t.forward(prefix[:, lo:lo + 256])
        for tokens in (int(n) for n in args.tokens.split(",")):
            times: dict = {c: [] for c in cols}
            ids = rng.integers(0, vocab, (1, tokens))
            for _ in range(args.reps):
                for k, way in cols:
                    target = targets[k]
                    target.attention_min_rows, target.min_rows = ways[way]
                    start = time.perf_counter()
                    target.forward(ids)
                    times[(k, way)].append(time.perf_counter() - start)
                    target.rollback(past)
            base = statistics.median(times[cols[0]])
            cells = [f"{statistics.median(v) * 1e3:.2f} ({statistics.median(v) / base:.2f}x)" for v in times.values()]
            print(f"| {past} | {tokens} | " + " | ".join(cells) + " |", flush=True)
        for t in targets.values():
            t.attention_min_rows, t.min_rows = 1, 1


if __name__ == "__main__":
    main()
