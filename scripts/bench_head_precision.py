"""A/B: an int4 target with an int4 head vs with an fp32 head (same weights), chain, adaptive, interleaved.

usage: python scripts/bench_head_precision.py N_PROMPTS [--convert]   (HEAD: the checkpoint folder below)
"""
import statistics, sys
import specrt
import specrt.convert.head_graph as hg
from specrt.convert.pipeline import ConvertOptions, convert
from specrt.datasets import load_prompts
from specrt.runtime.sampling import SamplingParams
head = "specrt/drafters/eagle3/heads/smollm2-135m-instruct"
if "--convert" in sys.argv:
    convert("smollm2-135m-instruct", "/tmp/specrt-ab/int4-h4", ConvertOptions(precision="int4", force=True, drafter=f"eagle3:{head}"))
    hg.head_precision = lambda p: "fp32"
    convert("smollm2-135m-instruct", "/tmp/specrt-ab/int4-h32", ConvertOptions(precision="int4", force=True, drafter=f"eagle3:{head}"))
engines = {k: specrt.load(f"/tmp/specrt-ab/int4-{k}", device="cpu", drafter="eagle3") for k in ("h4", "h32")}
params = SamplingParams(max_new_tokens=128, stop_token_ids=())
res = {k: [] for k in engines}; acc = {k: [] for k in engines}
for i, p in enumerate(load_prompts(dataset="mt-bench", limit=int(sys.argv[1]))):
    for k in (list(engines) if i % 2 == 0 else list(engines)[::-1]):
        engines[k].reset()
        r = engines[k].generate(p, params).wait()
        res[k].append(r.stats.tokens_per_second); acc[k].append(r.stats.mean_accepted)
for k in engines:
    print(k, "tok/s median %.1f" % statistics.median(res[k]), "mean accepted %.3f" % statistics.mean(acc[k]))
print("h4/h32 ratio median %.3f" % statistics.median(a / b for a, b in zip(res["h4"], res["h32"])))
