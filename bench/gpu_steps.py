"""Step costs of a bundle on one device: the target's verify(k) for k new tokens on a cache of P, and plain
against speculative decoding at fixed draft lengths with the drafter's and the verification's time per step.

With random weights (scripts/synthetic_model.py) nothing is accepted, so tokens/s of speculative decoding says
only what a draft costs; what matters is the curve verify(k) / verify(1): where it stays near 1, a drafter pays
for every token it gets accepted. Greedy speculative output is checked against plain output token for token
(losslessness needs no trained weights).

    python bench/gpu_steps.py BUNDLE [--device cuda] [--drafter eagle3] [--past 512] [--new 1,2,4,8,16]
                              [--fixed 1,2,4] [--tokens 32] [--reps 10] [--json OUT]

Prints Markdown tables; exits 1 if a speculative output differs from plain output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def _median_ms(call, reps: int, sync) -> float:
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _sync_for(device: str):
    if device in ("cuda", "rocm"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def verify_costs(engine, past: int, news: list[int], reps: int, sync) -> dict[int, float]:
    """Median ms of one target call feeding k tokens on a cache of `past`, per k (the cache is rolled back)."""
    rng = np.random.default_rng(0)
    vocab = engine.manifest.vocab_size
    engine.reset()
    engine.feed(rng.integers(0, vocab, past).tolist())
    target, out = engine.target, {}
    for k in news:
        ids = rng.integers(0, vocab, (1, k))

        def call(ids=ids):
            target.forward(ids)
            target.rollback(past)

        call()  # warm-up (first-call allocations, kernel selection)
        out[k] = _median_ms(call, reps, sync)
    return out


def fixed_length_runs(engine, lengths: list[int], tokens: int, prompt: str) -> list[dict]:
    """Plain decoding, then speculative at each fixed draft length (adaptive off): tokens/s, target calls and
    whether the output equals plain output."""
    from specrt.runtime.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=tokens, stop_token_ids=())
    engine.adaptive = False
    plain = engine.generate(prompt, params, drafter=None).wait()
    def row(k: int, result) -> dict:
        st = result.stats
        steps = max(st.target_calls - 1, 1)  # the calls after prefill
        return {"draft_length": k, "tokens_per_second": st.tokens_per_second, "target_calls": st.target_calls,
                "mean_accepted": st.mean_accepted, "draft_ms_per_step": 1e3 * st.draft_seconds / steps,
                "verify_ms_per_step": 1e3 * st.verify_seconds / steps,
                "equal": result.token_ids == plain.token_ids}

    rows = [row(0, plain)]
    for k in lengths:
        engine.max_draft = k
        rows.append(row(k, engine.generate(prompt, params).wait()))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--drafter", default="eagle3")
    ap.add_argument("--past", type=int, default=512)
    ap.add_argument("--new", default="1,2,4,8,16")
    ap.add_argument("--fixed", default="1,2,4", help="fixed draft lengths for the decoding runs")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import specrt

    engine = specrt.load(args.bundle, device=args.device, drafter=args.drafter)
    device = engine.target.device
    sync = _sync_for(device)
    news = [int(k) for k in args.new.split(",")]
    verify = verify_costs(engine, args.past, news, args.reps, sync)
    runs = fixed_length_runs(engine, [int(k) for k in args.fixed.split(",")], args.tokens, args.prompt)

    one = verify[news[0]]
    print(f"## {args.bundle} on {device} (target {engine.manifest.target.precision}, past {args.past})\n")
    print("| new tokens | verify ms | verify(k) / verify(1) |\n| --- | --- | --- |")
    for k, ms in verify.items():
        print(f"| {k} | {ms:.2f} | {ms / one:.2f} |")
    print(f"\n| draft length ({args.drafter}) | tokens/s | target calls | draft ms / step | verify ms / step | "
          "equal to plain |\n| --- | --- | --- | --- | --- | --- |")
    for row in runs:
        print(f"| {row['draft_length'] or 'plain'} | {row['tokens_per_second']:.1f} | {row['target_calls']} | "
              f"{row['draft_ms_per_step']:.2f} | {row['verify_ms_per_step']:.2f} | {row['equal']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bundle": args.bundle, "device": device, "past": args.past,
                       "verify_ms": verify, "fixed_length": runs}, f, indent=2)
    return 0 if all(row["equal"] for row in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
