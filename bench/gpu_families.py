"""Every family's GPU bundle on the device: placement predicted and placement observed, plain against speculative.

    python bench/gpu_families.py build DIR                      # here (no GPU needed): tiny int4 bundles built for
                                                                # CUDA, one per family; a few hundred KB to carry
    python bench/gpu_families.py run DIR --device cuda --json OUT

`build` converts the tests' tiny random checkpoints (dense Llama, the Qwen3.5 hybrid, Qwen3-MoE, gpt-oss, Gemma 4)
with `specrt convert --precision int4 --device cuda`. `run` loads each with the device's providers, with
SPECRT_NO_CPU_FALLBACK=1 (a node left to the CPU provider fails the session: the GPU check then says so) and
ONNX Runtime's profiler on, so the provider of every node is read from the running session and set beside
`specrt info --placement`'s prediction; then greedy plain decoding against speculative decoding with drafts that
are right and wrong in turn (the outputs must be equal), tokens/s of each, and that a tree draft is refused in one
line (GPU graphs verify chains). Outputs may part where float16 logits nearly tie, since a call of several tokens
rounds differently from one of one (default mode's losslessness: every token is the target's choice in the call
that verified it; GPU bundles have no batch-invariant mode yet): the first differing position is recorded. Random
weights: the timings are step costs, not speedups. Prints a Markdown table; exits 1 where a session fails.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

FAMILIES = ("llama", "qwen3_5_text", "qwen3_moe", "gpt_oss", "gemma4_text")
PROMPT = "the a of to in and is was it for on with as at by"


def build(folder: Path) -> None:
    sys.path.insert(len(sys.path), str(Path(__file__).resolve().parent.parent))  # tests.tiny_models, behind site
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    folder.mkdir(parents=True, exist_ok=True)
    for arch in FAMILIES:
        if (folder / arch / "specrt.json").is_file():
            continue
        src = save_tiny_bundle_source(arch, folder / f".{arch}-src")
        if main(["convert", str(src), "-o", str(folder / arch), "--precision", "int4", "--device", "cuda",
                 "--max-context", "128"]) != 0:
            raise SystemExit(f"gpu_families: {arch} did not convert")


class RightThenWrong:
    """Drafts the plain greedy continuation, every third draft shifted (rejected), as a chain."""

    def __init__(self, prompt_len: int, greedy: list[int], vocab: int):
        from specrt.runtime.drafter import Draft, Drafter

        class _D(Drafter):
            name = "right-then-wrong"
            calls = 0

            def reset(self, params=None, rng=None):
                pass

            def propose(self, context, max_tokens):
                done = len(context) - prompt_len
                truth = greedy[done:done + max_tokens]
                if not truth:
                    return None
                _D.calls += 1
                return Draft.chain(truth if _D.calls % 3 else [(t + 1) % vocab for t in truth])

        self.drafter = _D()


def observed_placement(prefix: str) -> Counter:
    """Nodes per provider in ONNX Runtime's profile files written under `prefix` (kernel events)."""
    counts = Counter()
    for path in glob.glob(prefix + "*.json"):
        nodes = {}
        for event in json.loads(Path(path).read_text()):
            args = event.get("args") or {}
            if event.get("cat") == "Node" and "provider" in args:
                nodes[event["name"].rsplit("_kernel_time", 1)[0]] = args["provider"]
        counts.update(nodes.values())
    return counts


def run(folder: Path, device: str, out: Path | None) -> int:
    import specrt
    from specrt.convert.placement import place_model, summarize
    from specrt.errors import SpecrtError
    from specrt.runtime.sampling import SamplingParams

    rows, failed = [], False
    os.environ["SPECRT_NO_CPU_FALLBACK"] = "1" if device != "cpu" else "0"
    for arch in FAMILIES:
        bundle = folder / arch
        predicted = summarize(place_model(bundle / "target.onnx", "cuda"))
        row = {"family": arch, "predicted_off_gpu": len(predicted.off_gpu), "predicted": predicted.by_verdict}
        prefix = str(folder / f".profile-{arch}-")
        os.environ["SPECRT_PROFILE_PREFIX"] = prefix
        try:
            engine = specrt.load(str(bundle), device=device, drafter="none")
        except SpecrtError as exc:
            # disable_cpu_ep_fallback fails on any node left to the CPU, ONNX Runtime's own shape arithmetic
            # (GetCpuPreferredNodes) included: say so, then load without it and read the placement from the profile
            row["strict"] = str(exc)[:300]
            os.environ["SPECRT_NO_CPU_FALLBACK"] = "0"
            try:
                engine = specrt.load(str(bundle), device=device, drafter="none")
            except SpecrtError as again:
                rows.append({**row, "error": str(again)})
                failed = True
                continue
            finally:
                os.environ["SPECRT_NO_CPU_FALLBACK"] = "1" if device != "cpu" else "0"
        finally:
            os.environ.pop("SPECRT_PROFILE_PREFIX", None)
        params = SamplingParams(max_new_tokens=48, stop_token_ids=())
        t0 = time.perf_counter()
        plain = engine.generate(PROMPT, params, drafter=None).wait().token_ids
        plain_s = time.perf_counter() - t0
        engine.reset()
        drafter = RightThenWrong(len(engine.prompt_ids(PROMPT)), plain, engine.manifest.vocab_size).drafter
        t0 = time.perf_counter()
        spec = engine.generate(PROMPT, params, drafter=drafter).wait()
        spec_s = time.perf_counter() - t0
        try:
            engine.target.forward(np.array([[1, 2]]), attention_bias=np.zeros((1, 1, 2, 2), np.float16))
            tree = "accepted (unexpected)"
        except SpecrtError:
            tree = "refused in one line"
        engine.target.session.end_profiling()
        first = next((i for i, (a, b) in enumerate(zip(spec.token_ids, plain)) if a != b), None)
        row.update(observed=dict(observed_placement(prefix)), equal=spec.token_ids == plain, first_difference=first,
                   plain_tok_s=round(len(plain) / plain_s, 1), spec_tok_s=round(len(spec.token_ids) / spec_s, 1),
                   mean_accepted=round(spec.stats.mean_accepted, 2), tree=tree)
        rows.append(row)
        for path in glob.glob(prefix + "*.json"):
            os.unlink(path)
    print("| family | predicted off the GPU | observed nodes by provider | plain tok/s | speculative tok/s | "
          "accepted/call | equal | tree |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['family']} | {r['predicted_off_gpu']} | session failed: {r['error'][:120]} | | | | | |")
            continue
        print(f"| {r['family']} | {r['predicted_off_gpu']} | {r['observed']} | {r['plain_tok_s']} | "
              f"{r['spec_tok_s']} | {r['mean_accepted']} | {r['equal']} | {r['tree']} |")
    if out:
        out.write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("build", "run"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "build":
        build(args.folder)
        return 0
    return run(args.folder, args.device, args.json)


if __name__ == "__main__":
    sys.exit(main())
