"""Prompt lookup's shortest match (1, 2 or 3 tokens) side by side with plain decoding, interleaved per prompt, greedy:
the median per-prompt ratio of tokens/s to plain decoding on each set.
Usage: python scripts/ngram_min_match.py [MODEL] [--limit 8]
"""

from __future__ import annotations

import argparse
import statistics

import specrt
from specrt.app.bench import rotation
from specrt.datasets import load_prompts
from specrt.drafters.ngram import NgramDrafter
from specrt.runtime.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=8)
    args = ap.parse_args()
    engine = specrt.load(args.model, device="cpu", drafter="none")
    # distinct names: each variant keeps its own record in the engine (runtime/pays.py)
    rows = {"none": None, **{f"min {n}": NgramDrafter(min_n=n, name=f"ngram{n}") for n in (1, 2, 3)}}
    params = SamplingParams(max_new_tokens=128)
    for dataset in ("mt-bench", "summarize", "gsm8k"):
        prompts = load_prompts(dataset=dataset, limit=args.limit)
        engine.generate(prompts[0], SamplingParams(max_new_tokens=8)).wait()  # warm-up
        speed = {k: [] for k in rows}
        for i, prompt in enumerate(prompts):
            for name in rotation(list(rows), i):
                engine.reset()
                speed[name].append(engine.generate(prompt, params, drafter=rows[name]).wait().stats.tokens_per_second)
        print(dataset, {k: round(statistics.median(a / b for a, b in zip(v, speed["none"])), 3)
                        for k, v in speed.items()}, flush=True)


if __name__ == "__main__":
    main()
