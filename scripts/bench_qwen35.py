"""Measure a Qwen3.5 hybrid bundle (issue 34): runtime memory, plain decoding, MTP and the replay drafter at stated
acceptances, `auto`, the cost of keeping an accepted prefix's recurrent state, and greedy speculative == plain.

    python scripts/bench_qwen35.py BUNDLE [--tokens 48] [--prompts 2] [--acceptance 0.74,0.88] [--json OUT]

Every configuration decodes the same prompts greedily from a reset cache, in one run (compare only within it), in
batch-invariant mode (`--batch-invariant`: every call rounds alike, so greedy speculation must equal plain decoding
token for token, and the replay drafter's tokens are the run's own); plain decoding in the default mode is timed
beside it.
The replay drafter (specrt/app/bench_replay.py) runs the bundle's MTP module for every draft, paying its real
cost, and then proposes plain decoding's own tokens, each right with the stated probability: the runtime's real
speed at that acceptance on random weights, where the module itself accepts nothing. Any other bundle too (issue
35's MoE targets): `--inner dflash` makes the replay pay the DFlash drafter's cost where the target has no MTP.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # specrt from a checkout

PROMPTS = ("Explain how a bicycle stays upright while moving.",
           "Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "List five ways to save energy at home and explain each one.",
           "Describe the water cycle to a ten-year-old.",
           "What are the pros and cons of working from home?",
           "Write a Python function that checks whether a string is a palindrome.")


def rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def replay_cost(engine, kept_values=(0, 1, 2, 3), reps: int = 5) -> dict[int, float]:
    """Milliseconds to restore the recurrent state after keeping `kept` of a 4-token call (the replay of
    runtime/recurrent_state.py), median of reps."""
    target = engine.target
    engine.reset()
    target.forward(np.array([[11, 12, 13, 14, 15, 16]]))
    base = target.length
    target.snapshot()  # each round restarts from here
    out = {}
    for kept in kept_values:
        times = []
        for _ in range(reps):
            target.forward(np.array([[21, 22, 23, 24]]))
            t = time.perf_counter()
            target.rollback(base + kept)
            times.append((time.perf_counter() - t) * 1000)
            target.rollback(target.reachable(base))
        out[kept] = statistics.median(times)
    engine.reset()
    return out


def main() -> None:
    import specrt
    from specrt.app.bench_replay import ReplayDrafter
    from specrt.app.api import make_drafter
    from specrt.runtime.sampling import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--acceptance", default="0.74,0.88")
    ap.add_argument("--lengths", default="1,2,3", help="fixed draft lengths to run")
    ap.add_argument("--only", default="", help="comma-separated label prefixes to run (plain is always run)")
    ap.add_argument("--repeats", type=int, default=1, choices=(1, 2),
                    help="2: each prompt's configurations run twice, in mirrored order")
    ap.add_argument("--inner", default="mtp",
                    help="the bundle's drafter whose cost the replay drafter pays and whose fixed lengths run "
                         "(mtp; dflash on a target without MTP, e.g. Qwen3-30B-A3B; none: drafts cost nothing, an "
                         "upper bound for a drafter at that acceptance)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bundle = Path(args.bundle)
    rss0 = rss_gib()
    t0 = time.perf_counter()
    engine = specrt.load(str(bundle), device="cpu", batch_invariant=True)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_gib()
    providers = ["CPUExecutionProvider"]
    params = SamplingParams(max_new_tokens=args.tokens, stop_token_ids=())
    prompts = PROMPTS[:args.prompts]
    results: dict[str, dict] = {}
    inner = None if args.inner == "none" else make_drafter(args.inner, bundle, engine.manifest, providers)
    auto = make_drafter("auto", bundle, engine.manifest, providers)
    lengths = [int(k) for k in args.lengths.split(",")]
    plain: dict[str, list[int]] = {}
    engine.generate(prompts[0], params, drafter=None).wait()  # warm-up: weights paged in, kernels prepacked
    for prompt in prompts:
        engine.reset()
        plain[prompt] = engine.generate(prompt, params, drafter=None).wait().token_ids
    rss_decoding = rss_gib()

    def replay(acceptance):
        return lambda p: ReplayDrafter(len(engine.prompt_ids(p)), plain[p], engine.manifest.vocab_size, acceptance,
                                       inner=inner)

    # label -> (drafter for a prompt, fixed draft length or None, batch-invariant)
    configs = {"plain": (lambda p: None, None, True), "plain, default mode": (lambda p: None, None, False)}
    if inner is not None:
        configs.update({f"{args.inner} k={k} (random weights)": (lambda p: inner, k, True) for k in lengths})
    for acceptance in [float(a) for a in args.acceptance.split(",")]:
        configs.update({f"replay {acceptance:.0%} k={k}": (replay(acceptance), k, True) for k in lengths})
        configs[f"replay {acceptance:.0%} adaptive"] = (replay(acceptance), None, True)
    configs["auto (every drafter + ngram)"] = (lambda p: auto, None, True)
    configs["auto, default mode"] = (lambda p: auto, None, False)
    if args.only:
        keep = ["plain"] + args.only.split(",")
        configs = {k: v for k, v in configs.items() if any(k.startswith(p) for p in keep)}
    rows = {label: {"rates": [], "equal": [], "calls": 0, "draft_s": 0.0, "verify_s": 0.0} for label in configs}
    labels = list(configs)
    runs = []  # (prompt index, label): every configuration on each prompt, in a rotating order; with --repeats 2
    for n in range(len(prompts)):  # the order is then mirrored (A B ... B A) so that drift cancels
        order = labels[n % len(labels):] + labels[:n % len(labels)]
        runs += [(n, label) for label in (order + order[::-1] if args.repeats == 2 else order)]
    for n, label in runs:
        prompt = prompts[n]
        drafter_for, k, exact = configs[label]
        engine.draft_length, engine.adaptive, engine.batch_invariant = k, k is None, exact
        engine.reset()
        out = engine.generate(prompt, params, drafter=drafter_for(prompt)).wait()
        row = rows[label]
        row.setdefault("by_prompt", {}).setdefault(n, []).append(out.stats.tokens_per_second)
        row["rates"].append(out.stats.tokens_per_second)
        row["equal"].append(out.token_ids == plain[prompt])
        row["calls"] += out.stats.target_calls
        row["draft_s"] += out.stats.draft_seconds
        row["verify_s"] += out.stats.verify_seconds
    engine.batch_invariant = True
    base = statistics.mean(rows["plain"]["rates"])
    own_base = "plain, default mode"
    for label, row in rows.items():
        steps = max(row["calls"] - len(runs) // len(labels), 1)
        rate = statistics.mean(row["rates"])
        # per prompt: this row's mean rate over the plain row of its own mode (default mode: "plain, default mode")
        own = "plain, default mode" if "default mode" in label and label != own_base else "plain"
        ratios = [statistics.mean(row["by_prompt"][n]) / statistics.mean(rows[own]["by_prompt"][n])
                  for n in sorted(row["by_prompt"])]
        results[label] = {"tok_s": rate, "ratio_to_plain": statistics.mean(ratios), "worst_ratio": min(ratios),
                          "equal_plain": all(row["equal"]), "target_calls": row["calls"],
                          "draft_ms_per_step": 1000 * row["draft_s"] / steps,
                          "verify_ms_per_step": 1000 * row["verify_s"] / steps}
        print(f"{label:28s} {rate:6.2f} tok/s  {statistics.mean(ratios):5.2f}x plain (worst {min(ratios):.2f})  "
              f"calls {row['calls']:4d}  draft {results[label]['draft_ms_per_step']:7.1f} ms/step  verify "
              f"{results[label]['verify_ms_per_step']:7.1f} ms/step  equal to plain: {all(row['equal'])}", flush=True)
    print(f"(plain in batch-invariant mode: {base:.2f} tok/s, the base of the ratios; default-mode rows: plain in "
          "default mode)")
    replay = replay_cost(engine) if not args.only and engine.target.states else {}
    print("state restore after keeping k of a 4-token call (ms): " +
          ", ".join(f"k={k}: {v:.2f}" for k, v in replay.items()))
    states = engine.target.states
    state_mib = states.nbytes() / 2**20 if states else 0
    print(f"runtime RSS: {rss0:.2f} GiB before load, {rss_loaded:.2f} GiB loaded ({load_s:.1f} s), "
          f"{rss_decoding:.2f} GiB decoding, peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB; "
          f"recurrent + conv state buffers (two of each) {state_mib:.1f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "replay_ms": replay, "rss_loaded_gib": rss_loaded,
                                               "rss_decoding_gib": rss_decoding, "load_s": load_s,
                                               "state_buffers_mib": state_mib}, indent=1))


if __name__ == "__main__":
    main()
