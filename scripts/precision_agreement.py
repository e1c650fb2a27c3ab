"""How far a quantized bundle's greedy output follows the fp32 bundle's: per dataset, completions equal token for
token, and the mean number of tokens before the first difference.

usage: python scripts/precision_agreement.py FP32_BUNDLE OTHER_BUNDLE [OTHER_BUNDLE ...]
           [--dataset mt-bench --dataset humaneval ...] [--limit 8] [--max-new-tokens 128]
Plain decoding (no drafter), so the figures are the precision's own, not a drafter's."""

from __future__ import annotations

import argparse

import specrt
from specrt.bundle import load_bundle
from specrt.datasets import load_prompts
from specrt.runtime.sampling import SamplingParams


def greedy(bundle: str, prompts: list[str], new_tokens: int) -> list[list[int]]:
    engine = specrt.load(bundle, device="cpu", drafter=None)
    params = SamplingParams(max_new_tokens=new_tokens, stop_token_ids=())
    out = []
    for prompt in prompts:
        engine.reset()
        out.append(engine.generate(prompt, params).wait().token_ids)
    return out


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference")
    ap.add_argument("others", nargs="+")
    ap.add_argument("--dataset", action="append", default=None)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    print("| dataset | bundle | equal completions | mean tokens before the first difference |")
    print("|---|---|---|---|")
    for dataset in args.dataset or ["mt-bench", "humaneval", "gsm8k"]:
        prompts = load_prompts(dataset=dataset, limit=args.limit)
        reference = greedy(args.reference, prompts, args.max_new_tokens)
        for other in args.others:
            outputs = greedy(other, prompts, args.max_new_tokens)
            same = sum(a == b for a, b in zip(reference, outputs))
            prefix = sum(first_difference(a, b) for a, b in zip(reference, outputs)) / len(prompts)
            name = load_bundle(other, check_hashes=False).target.precision
            print(f"| {dataset} | {name} | {same}/{len(prompts)} | {prefix:.1f} of {args.max_new_tokens} |", flush=True)


if __name__ == "__main__":
    main()
