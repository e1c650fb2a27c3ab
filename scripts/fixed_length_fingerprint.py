"""Fixed draft length (adaptive off), greedy: per drafter, the token ids, target calls and acceptance by depth of
3 prompts x 48 tokens, as one fingerprint per drafter. Run it with two checkouts (before and after a refactor) on
the same bundles: the outputs must be identical. Usage: python scripts/fixed_length_fingerprint.py SPECRT_CACHE
(a cache holding the catalog bundles smollm2-135m-instruct-int4, -fp32 and -fp32-draft)."""
import hashlib, json, sys
import specrt
from specrt.runtime.sampling import SamplingParams

cache = sys.argv[1]
prompts = ["Write a haiku about the sea.", "Explain what a hash table is.", "List three uses of copper."]
rows = {}
for bundle, drafters in ((f"{cache}/bundles/smollm2-135m-instruct-int4", ["none", "ngram", "eagle3", "dflash"]),
                         (f"{cache}/bundles/smollm2-135m-instruct-fp32", ["none", "ngram", "eagle3", "eagle3:tree",
                                                                          "dflash"]),
                         (f"{cache}/bundles/smollm2-135m-instruct-fp32-draft", ["draft-model", "draft-model+ngram"])):
    for d in drafters:
        engine = specrt.load(bundle, device="cpu", drafter=d, batch_invariant=bundle.endswith("int4"))
        engine.adaptive = False
        out = []
        for p in prompts:
            r = engine.generate(p, SamplingParams(max_new_tokens=48)).wait()
            out.append([r.token_ids, r.stats.target_calls, r.stats.acceptance_by_position])
        rows[f"{bundle.rsplit('/', 1)[1]} {d}"] = hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16] + \
            f" calls={sum(o[1] for o in out)}"
for k, v in rows.items():
    print(k, v)
