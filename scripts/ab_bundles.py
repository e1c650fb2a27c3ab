"""A/B of two bundles of one model (e.g. a draft model with and without a draft vocabulary), interleaved prompt by
prompt: plain decoding on A, then each drafter on A and on B, greedy, on a benchmark set. Prints, per row, median
tokens/s, the median per-prompt ratio to A's plain decoding and mean accepted tokens per target call.
(Losslessness is the tests' business; this only times.)
Usage: python scripts/ab_bundles.py A_BUNDLE B_BUNDLE --drafter draft-model [--dataset mt-bench] [--limit 8]
"""

from __future__ import annotations

import argparse
import statistics

import specrt
from specrt.app.api import DEFAULT_BATCH_INVARIANT, make_drafter
from specrt.datasets import load_prompts
from specrt.runtime.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--drafter", action="append", required=True)
    ap.add_argument("--dataset", default="mt-bench")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    engines = {"A": specrt.load(args.a, device="cpu"), "B": specrt.load(args.b, device="cpu")}
    rows = [("A", "none")] + [(side, d) for d in args.drafter for side in ("A", "B")]
    drafters = {(side, d): None if d == "none" else
                make_drafter(d, engines[side].bundle_dir, engines[side].manifest, engines[side].providers)
                for side, d in rows}
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    tps: dict[tuple, list[float]] = {r: [] for r in rows}
    acc: dict[tuple, list[float]] = {r: [] for r in rows}
    prompts = load_prompts(dataset=args.dataset, limit=args.limit)
    for i, prompt in enumerate(prompts):
        for r in rows[i % len(rows):] + rows[:i % len(rows)]:  # every row takes every slot in turn
            engine = engines[r[0]]
            engine.reset()
            engine.batch_invariant = DEFAULT_BATCH_INVARIANT
            res = engine.generate(prompt, params, drafter=drafters[r]).wait()
            tps[r].append(res.stats.tokens_per_second)
            acc[r].append(res.stats.mean_accepted)
        print(f"[{i + 1}/{len(prompts)}] " + "  ".join(f"{s}:{d} {tps[(s, d)][-1]:.1f}" for s, d in rows), flush=True)
    base = tps[("A", "none")]
    print(f"\n{args.dataset} ({len(prompts)} prompts, {args.max_new_tokens} tokens, greedy)")
    print("| bundle | drafter | tok/s | vs A plain | mean accepted |\n|---|---|---|---|---|")
    for r in rows:
        ratio = statistics.median(a / b for a, b in zip(tps[r], base))
        print(f"| {r[0]} | {r[1]} | {statistics.median(tps[r]):.1f} | {ratio:.2f}x | {statistics.mean(acc[r]):.2f} |")


if __name__ == "__main__":
    main()
