"""What a head-carrying bundle costs plain decoding: the same model converted with and without the EAGLE-3
head (whose target graph also emits three layers' hidden states), plain decoding only, interleaved per prompt.

usage: python scripts/bench_taps_cost.py BUNDLE_WITH_HEAD BUNDLE_WITHOUT [N_PROMPTS]
"""

from __future__ import annotations

import argparse
import statistics

import specrt
from specrt.datasets import load_prompts
from specrt.runtime.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("with_head", metavar="BUNDLE_WITH_HEAD")
    ap.add_argument("without", metavar="BUNDLE_WITHOUT")
    ap.add_argument("n", metavar="N_PROMPTS", nargs="?", type=int, default=10)
    args = ap.parse_args()
    with_head, without, n = args.with_head, args.without, args.n
    engines = {"with head": specrt.load(with_head, device="cpu", drafter="none", batch_invariant=False),
               "without": specrt.load(without, device="cpu", drafter="none", batch_invariant=False)}
    params = SamplingParams(max_new_tokens=128, stop_token_ids=())
    speeds = {name: [] for name in engines}
    for i, prompt in enumerate(load_prompts(dataset="mt-bench", limit=n)):
        order = list(engines)[i % 2:] + list(engines)[:i % 2]
        for name in order:
            engines[name].reset()
            speeds[name].append(engines[name].generate(prompt, params, drafter=None).wait().stats.tokens_per_second)
    ratios = [a / b for a, b in zip(speeds["with head"], speeds["without"])]
    for name, v in speeds.items():
        print(f"{name:10s} plain tok/s median {statistics.median(v):.1f}")
    print(f"with/without per-prompt ratio: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
