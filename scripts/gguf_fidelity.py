"""How closely each way of running a GGUF follows the model it holds (issue 36): specrt bundles converted from the
GGUF (--precision gguf, int4, int8) and llama.cpp on the file itself, each held to the fp32 bundle of the same GGUF
(the file's exact dequantization, in float).

    python scripts/gguf_fidelity.py MODEL.gguf --bundle fp32=B_FP32 --bundle gguf=B_GGUF --bundle int4=B_INT4 \
        [--bundle int8=B_INT8] [--llama-cpp] [--positions 1024] [--prompts 6] [--tokens 64] [--json OUT]

Per system: top-1 agreement with the reference, teacher-forced over `positions` tokens of held-out text (MT-Bench,
GSM8K and HumanEval prompts run together, in windows of 512 tokens, no chat template); the mean number of greedy
tokens before the first difference from the reference's greedy output (chat prompts from the same sets); plain
decode tok/s from those runs (in one run: compare within it); the model's size on disk against the GGUF's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

WINDOW = 512


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def bundle_bytes(path: Path) -> int:
    from specrt.bundle import load_bundle

    target = load_bundle(path, check_hashes=False).target
    return sum((path / f).stat().st_size for f in (target.file, target.data_file) if (path / f).exists())


def held_out_windows(tokenizer_json: Path, positions: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    from specrt.datasets import load_prompts

    tok = Tokenizer.from_file(str(tokenizer_json))
    text = "\n\n".join(p for d in ("mt-bench", "gsm8k", "humaneval") for p in load_prompts(dataset=d))
    ids = tok.encode(text).ids
    windows = [ids[lo:lo + WINDOW] for lo in range(0, len(ids), WINDOW)]
    need = -(-(positions + 1) // WINDOW)  # each window scores its positions after the first
    return windows[:max(need, 1)]


def teacher_forced(bundle: str, windows: list[list[int]]) -> np.ndarray:
    import specrt

    engine = specrt.load(bundle, device="cpu", drafter=None)
    out = []
    for w in windows:
        engine.target.reset()
        logits = engine.target.forward(np.array([w], np.int64))
        logits = logits[0] if isinstance(logits, tuple) else logits
        out.append(np.argmax(logits[0, :-1], axis=-1))  # the choice after each prefix, the last one unchecked
    return np.concatenate(out)


def greedy(bundle: str, prompts: list[str], tokens: int, ids_of) -> tuple[list[list[int]], float]:
    import specrt
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(bundle, device="cpu", drafter=None)
    params = SamplingParams(max_new_tokens=tokens, stop_token_ids=())
    outs, rates = [], []
    for prompt in prompts:
        engine.reset()
        r = engine.generate(prompt, params, drafter=None, ids=ids_of(prompt)).wait()
        outs.append(r.token_ids)
        rates.append(r.stats.tokens_per_second)
    return outs, statistics.mean(rates)


def main() -> None:
    import specrt
    from specrt.datasets import load_prompts

    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--bundle", action="append", required=True, help="NAME=PATH; the one named fp32 is the reference")
    ap.add_argument("--llama-cpp", action="store_true")
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bundles = dict(b.split("=", 1) for b in args.bundle)
    reference = bundles["fp32"]
    windows = held_out_windows(Path(reference) / "tokenizer.json", args.positions)
    prompts = [p for d in ("mt-bench", "gsm8k", "humaneval") for p in load_prompts(dataset=d, limit=args.prompts // 3)]
    ref_engine = specrt.load(reference, device="cpu", drafter=None)
    prompt_ids = {p: ref_engine.prompt_ids(p) for p in prompts}
    del ref_engine
    ref_top1 = teacher_forced(reference, windows)
    ref_greedy, ref_rate = greedy(reference, prompts, args.tokens, prompt_ids.get)
    gguf_size = args.gguf.stat().st_size
    rows = {"fp32": {"top1": 1.0, "prefix": float(args.tokens), "tok_s": ref_rate,
                     "size_vs_gguf": bundle_bytes(Path(reference)) / gguf_size}}
    for name, path in bundles.items():
        if name == "fp32":
            continue
        top1 = teacher_forced(path, windows)
        outs, rate = greedy(path, prompts, args.tokens, prompt_ids.get)
        rows[name] = {"top1": float(np.mean(top1 == ref_top1)),
                      "prefix": statistics.mean(first_difference(a, b) for a, b in zip(outs, ref_greedy)),
                      "tok_s": rate, "size_vs_gguf": bundle_bytes(Path(path)) / gguf_size}
        print(name, rows[name], flush=True)
    if args.llama_cpp:
        from specrt.app.compare.systems import llama_cpp_python
        from specrt.app.compare.worker_client import WorkerProcess

        python = llama_cpp_python(log=lambda m: print(m, file=sys.stderr))
        workers = Path(specrt.__file__).resolve().parent / "app" / "compare" / "workers"
        config = {"model": str(args.gguf.resolve()), "threads": 2, "n_ctx": 2048}
        scorer = WorkerProcess(python, workers / "llama_cpp_score_worker.py", config, Path("/tmp/specrt-score.log"))
        try:
            top1 = np.concatenate([scorer.generate(w, 0, ()).token_ids[:-1] for w in windows])
        finally:
            scorer.close()
        decoder = WorkerProcess(python, workers / "llama_cpp_worker.py", config, Path("/tmp/specrt-llamacpp.log"))
        try:
            runs = [decoder.generate(prompt_ids[p], args.tokens, ()) for p in prompts]
        finally:
            decoder.close()
        rows["llama.cpp"] = {"top1": float(np.mean(top1 == ref_top1)),
                             "prefix": statistics.mean(first_difference(r.token_ids, b)
                                                       for r, b in zip(runs, ref_greedy)),
                             "tok_s": statistics.mean(r.tokens_per_second for r in runs), "size_vs_gguf": 1.0,
                             "version": decoder.version}
    print(f"\n{args.gguf.name}: {len(ref_top1)} teacher-forced positions, {len(prompts)} prompts x {args.tokens} "
          "greedy tokens; reference: the fp32 bundle of the same GGUF")
    print("| system | top-1 agreement | tokens before the first greedy difference | decode tok/s | size vs GGUF |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['top1']:.1%} | {r['prefix']:.1f} of {args.tokens} | {r['tok_s']:.1f} | "
              f"{r['size_vs_gguf']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"gguf": str(args.gguf), "positions": int(len(ref_top1)),
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
