"""Quick side-by-side of plain decoding and drafters on one bundle, with a greedy losslessness check.

10 chat prompts x 128 tokens, greedy; drafters: ngram, an always-right oracle and an always-wrong one
(tests/oracle_drafters.py). Prints mismatches (should be 0), total seconds per system, mean accepted.
Usage: python scripts/bench_drafters_quick.py BUNDLE   (run from the repository root)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(bundle: str) -> None:
    import specrt
    from specrt.drafters.ngram import NgramDrafter
    from specrt.runtime.sampling import SamplingParams
    from tests.oracle_drafters import OracleDrafter
    from tests.test_runtime_real import PROMPTS

    engine = specrt.load(bundle, device="cpu")
    params = SamplingParams(max_new_tokens=128, stop_token_ids=())
    seconds = {"plain": 0.0, "ngram": 0.0, "right": 0.0, "wrong": 0.0}
    accepted: dict[str, list[float]] = {}
    mismatches = 0
    for prompt in PROMPTS:
        engine.reset()
        t = time.perf_counter()
        plain = engine.generate(prompt, params, drafter=None).wait()
        seconds["plain"] += time.perf_counter() - t
        n = len(engine.prompt_ids(prompt))
        for mode in ("ngram", "right", "wrong"):
            drafter = NgramDrafter() if mode == "ngram" else OracleDrafter(n, plain.token_ids, engine.manifest.vocab_size, mode)
            engine.reset()
            t = time.perf_counter()
            res = engine.generate(prompt, params, drafter=drafter).wait()
            seconds[mode] += time.perf_counter() - t
            accepted.setdefault(mode, []).append(res.stats.mean_accepted)
            if res.token_ids != plain.token_ids:
                mismatches += 1
                at = next(i for i, (a, b) in enumerate(zip(res.token_ids, plain.token_ids)) if a != b)
                print(f"MISMATCH {mode}: {prompt!r} at token {at}")
    print(f"mismatches: {mismatches}")
    print("| system | seconds | vs plain | mean accepted |\n|---|---|---|---|")
    for name, s in seconds.items():
        acc = sum(accepted[name]) / len(accepted[name]) if name in accepted else 1.0
        print(f"| {name} | {s:.1f} | {seconds['plain'] / s:.2f}x | {acc:.2f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    main(ap.parse_args().bundle)
