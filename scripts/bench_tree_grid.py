"""Tree shape grid for a head-carrying bundle: plain, chains and trees (topk, depth, nodes), adaptive, interleaved.

usage: python scripts/bench_tree_grid.py BUNDLE N_PROMPTS
"""
import statistics, sys
import specrt
from specrt.datasets import load_prompts
from specrt.runtime.sampling import SamplingParams
bundle = sys.argv[1]; n = int(sys.argv[2])
engine = specrt.load(bundle, device="cpu", drafter="eagle3")
params = SamplingParams(max_new_tokens=128, stop_token_ids=())
configs = [("plain", None), ("chain4", (1, 0, 4)), ("chain6", (1, 0, 6)), ("t3d2n6", (3, 2, 6)), ("t3d3n6", (3, 3, 6)),
           ("t4d3n8", (4, 3, 8)), ("t2d4n6", (2, 4, 6)), ("t2d3n4", (2, 3, 4))]
speed = {c: [] for c, _ in configs}; acc = {c: [] for c, _ in configs}
for i, p in enumerate(load_prompts(dataset="mt-bench", limit=n)):
    order = configs[i % len(configs):] + configs[:i % len(configs)]
    for name, cfg in order:
        engine.reset()
        if cfg is None:
            r = engine.generate(p, params, drafter=None).wait()
        else:
            k, d, m = cfg
            if k == 1:
                engine.drafter.topk, engine.drafter.max_draft = 1, m
            else:
                engine.drafter.use_tree(k, d, m)
            r = engine.generate(p, params).wait()
        speed[name].append(r.stats.tokens_per_second); acc[name].append(r.stats.mean_accepted)
for name, _ in configs:
    ratio = statistics.median(a / b for a, b in zip(speed[name], speed["plain"]))
    print(f"{name:8s} tok/s {statistics.median(speed[name]):6.1f}  accepted/call {statistics.mean(acc[name]):.2f}  speedup {ratio:.2f}")
