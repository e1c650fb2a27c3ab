"""Plain decoding speed: specrt vs onnxruntime-genai vs llama.cpp (llama-cpp-python), side by side.

Every system decodes the same 10 chat prompts greedily for exactly 128 new tokens (end-of-sequence
suppressed), prompt processing included; systems alternate per prompt so that machine noise hits all.
Run with a Python that has onnxruntime-genai and llama-cpp-python (systems missing are reported):
    python scripts/bench_decode.py --specrt fp32=BUNDLE32 --specrt int4=BUNDLE4 \
        --genai fp32=GENAI32 --genai int4=GENAI4 --gguf MODEL.gguf [--new 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.test_runtime_real import PROMPTS  # noqa: E402  (the 10 chat prompts of the runtime tests)


def specrt_runner(bundle: str, new: int):
    import specrt
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(bundle, device="cpu")
    params = SamplingParams(max_new_tokens=new, stop_token_ids=())

    def run(prompt: str) -> int:
        engine.reset()  # no KV reuse across prompts: every system prefills every prompt
        return engine.generate(prompt, params).wait().stats.new_tokens

    return run, engine.prompt_ids


def genai_runner(folder: str, new: int, prompt_ids):
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(folder)

    def run(prompt: str) -> int:
        ids = prompt_ids(prompt)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + new, min_length=len(ids) + new, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(np.array(ids, dtype=np.int32))
        count = 0
        while not gen.is_done():
            gen.generate_next_token()
            count += 1
        return count

    return run


def llamacpp_runner(gguf: str, new: int, prompt_ids):
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=2, verbose=False)
    eos = llm.token_eos()

    def run(prompt: str) -> int:
        llm.reset()
        out = llm.create_completion(prompt_ids(prompt), max_tokens=new, temperature=0.0, top_k=1,
                                    logit_bias={eos: -1e9, 2: -1e9, 0: -1e9})
        return out["usage"]["completion_tokens"]

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specrt", action="append", default=[], help="LABEL=BUNDLE")
    ap.add_argument("--genai", action="append", default=[], help="LABEL=onnxruntime-genai model folder")
    ap.add_argument("--gguf", default=None, help="GGUF file for llama.cpp")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N prompts (a large model is slow)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    runners, prompt_ids, failures = {}, None, {}
    for spec in args.specrt:
        label, path = spec.split("=", 1)
        runners[f"specrt {label}"], prompt_ids = specrt_runner(path, args.new)
    for spec in args.genai:
        label, path = spec.split("=", 1)
        try:
            runners[f"onnxruntime-genai {label}"] = genai_runner(path, args.new, prompt_ids)
        except Exception as exc:  # reported, not dropped
            failures[f"onnxruntime-genai {label}"] = f"{type(exc).__name__}: {exc}"
    if args.gguf:
        try:
            runners["llama.cpp (GGUF as is)"] = llamacpp_runner(args.gguf, args.new, prompt_ids)
        except Exception as exc:
            failures["llama.cpp (GGUF as is)"] = f"{type(exc).__name__}: {exc}"
    totals = {name: [0, 0.0] for name in runners}
    for name, run in runners.items():  # warm-up
        run(PROMPTS[0])
    for prompt in PROMPTS[:args.prompts]:
        for name, run in runners.items():
            t = time.perf_counter()
            n = run(prompt)
            totals[name][0] += n
            totals[name][1] += time.perf_counter() - t
    base = next(iter(totals))
    base_tps = totals[base][0] / totals[base][1]
    print(f"| system | tokens | seconds | tokens/s | vs {base} |\n|---|---|---|---|---|")
    rows = []
    for name, (n, s) in totals.items():
        rows.append({"system": name, "tokens": n, "seconds": s, "tokens_per_second": n / s})
        print(f"| {name} | {n} | {s:.1f} | {n / s:.1f} | {n / s / base_tps:.2f}x |")
    for name, why in failures.items():
        print(f"| {name} | could not run: {why} | | | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "failures": failures}, f, indent=1)


if __name__ == "__main__":
    main()
