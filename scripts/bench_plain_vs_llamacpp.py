"""Plain decoding, specrt's bundle against llama.cpp (llama-cpp-python, in its own environment from `specrt bench
--compare llama.cpp`) on the same random weights, alternating per prompt, greedy, the same prompt ids.

    python scripts/bench_plain_vs_llamacpp.py BUNDLE MODEL.gguf [--tokens 48] [--prompts 3]

MODEL.gguf: the bundle's source written by scripts/synthetic_gguf.py (Q4_0; a Qwen3.5 folder becomes llama.cpp's
qwen35 layout). Decode tok/s as each system's own clock measures it (prompt processing apart).
--one-at-a-time: every prompt on specrt first, the engine freed, then on llama.cpp (for models where both systems'
weights together exceed the memory: llama.cpp's mapped file would be evicted page by page while specrt holds its own).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

PROMPTS = ("Explain how a bicycle stays upright while moving.",
           "Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "List five ways to save energy at home and explain each one.")


def main() -> None:
    import specrt
    from specrt.app.compare.systems import llama_cpp_python
    from specrt.app.compare.worker_client import WorkerProcess
    from specrt.runtime.sampling import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("gguf")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--one-at-a-time", action="store_true")
    args = ap.parse_args()
    params = SamplingParams(max_new_tokens=args.tokens, stop_token_ids=())
    if args.one_at_a_time:  # the engine is loaded (and freed) there: no other reference may hold it
        return one_at_a_time(params, args)
    engine = specrt.load(args.bundle, device="cpu")
    python = llama_cpp_python(log=lambda m: print(m, file=sys.stderr))
    script = Path(specrt.__file__).resolve().parent / "app" / "compare" / "workers" / "llama_cpp_worker.py"
    worker = WorkerProcess(python, script, {"model": str(Path(args.gguf).resolve()), "threads": 2, "n_ctx": 2048},
                           Path("/tmp/specrt-llamacpp-worker.log"))
    rates = {"specrt": [], "llama.cpp": []}
    agree = []
    try:
        for prompt in PROMPTS[:args.prompts]:
            ids = engine.prompt_ids(prompt)
            engine.reset()
            ours = engine.generate(prompt, params, drafter=None, ids=ids).wait()
            theirs = worker.generate(ids, args.tokens, stop_ids=())
            rates["specrt"].append(ours.stats.tokens_per_second)
            rates["llama.cpp"].append(theirs.tokens_per_second)
            agree.append(next((i for i, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids)) if a != b),
                              min(len(ours.token_ids), len(theirs.token_ids))))
            print(f"{prompt[:40]!r}: specrt {ours.stats.tokens_per_second:.2f} tok/s, llama.cpp "
                  f"{theirs.tokens_per_second:.2f} tok/s ({len(theirs.token_ids)} tokens; outputs agree for "
                  f"{agree[-1]} tokens)", flush=True)
    finally:
        worker.close()
    s, l = statistics.mean(rates["specrt"]), statistics.mean(rates["llama.cpp"])
    print(f"mean decode: specrt {engine.manifest.target.precision} {s:.2f} tok/s, llama.cpp {worker.version} "
          f"Q4_0 {l:.2f} tok/s; specrt / llama.cpp = {s / l:.2f}")


def one_at_a_time(params, args) -> None:
    import gc

    import specrt
    from specrt.app.compare.systems import llama_cpp_python
    from specrt.app.compare.worker_client import WorkerProcess

    engine = specrt.load(args.bundle, device="cpu")
    prompts = [engine.prompt_ids(p) for p in PROMPTS[:args.prompts]]
    ours = []
    for prompt, ids in zip(PROMPTS, prompts):
        engine.reset()
        ours.append(engine.generate(prompt, params, drafter=None, ids=ids).wait())
        print(f"specrt {prompt[:40]!r}: {ours[-1].stats.tokens_per_second:.2f} tok/s", flush=True)
    precision = engine.manifest.target.precision
    del engine
    gc.collect()
    from specrt.convert.memory import release_freed_memory

    release_freed_memory()  # glibc keeps freed pages: hand them back before llama.cpp maps its file
    rss = int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) / (1 << 20)
    print(f"specrt freed: resident {rss:.2f} GiB", flush=True)
    python = llama_cpp_python(log=lambda m: print(m, file=sys.stderr))
    script = Path(specrt.__file__).resolve().parent / "app" / "compare" / "workers" / "llama_cpp_worker.py"
    worker = WorkerProcess(python, script, {"model": str(Path(args.gguf).resolve()), "threads": 2, "n_ctx": 2048},
                           Path("/tmp/specrt-llamacpp-worker.log"))
    try:
        theirs = [worker.generate(ids, args.tokens, stop_ids=()) for ids in prompts]
    finally:
        worker.close()
    for a, b in zip(ours, theirs):
        same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                    min(len(a.token_ids), len(b.token_ids)))
        print(f"llama.cpp {b.tokens_per_second:.2f} tok/s ({len(b.token_ids)} tokens; outputs agree for {same})")
    s = statistics.mean(o.stats.tokens_per_second for o in ours)
    t = statistics.mean(o.tokens_per_second for o in theirs)
    print(f"mean decode (one system in memory at a time): specrt {precision} {s:.2f} tok/s, llama.cpp "
          f"{worker.version} Q4_0 {t:.2f} tok/s; specrt / llama.cpp = {s / t:.2f}")


if __name__ == "__main__":
    main()
