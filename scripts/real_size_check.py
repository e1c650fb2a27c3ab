"""Load a bundle, report what it costs in memory, and check greedy speculative output against plain output.

    python scripts/real_size_check.py BUNDLE --drafter eagle3 [--tokens 32] [--prompt TEXT] [--json OUT]

Prints one JSON object: the bundle's size on disk, this process's resident memory before and after loading
(and its peak while loading and overall), the KV cache's size, plain and speculative decoding's tokens/s, mean accepted tokens, and
whether the two outputs are equal token for token (exit status 1 if they are not). With random weights
(scripts/synthetic_model.py) acceptance means nothing; memory, speed and equality do.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

GIB = 1 << 30


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def check(bundle: Path, drafter: str, tokens: int = 32,
          prompt: str = "Write a short story about a lighthouse keeper.") -> dict:
    import specrt
    from specrt.runtime.sampling import SamplingParams

    bundle = Path(bundle)
    before = rss_bytes()
    t0 = time.time()
    engine = specrt.load(str(bundle), drafter=drafter)
    load_seconds = time.time() - t0
    loaded = rss_bytes()
    loading_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the high-water mark of loading
    params = SamplingParams(max_new_tokens=tokens, stop_token_ids=())
    plain = engine.generate(prompt, params, drafter=None).wait()
    engine.reset()
    spec = engine.generate(prompt, params).wait()
    m = engine.manifest
    kv_bytes = 2 * sum(h * d for h, d in m.kv.shapes()) * m.kv.max_context * (2 if m.kv.dtype == "float16" else 4)
    return {
        "bundle": str(bundle),
        "bundle_gib": round(sum(f.stat().st_size for f in bundle.iterdir() if f.is_file()) / GIB, 3),
        "target_data_gib": round((bundle / m.target.data_file).stat().st_size / GIB, 3),
        "kv_cache_gib": round(kv_bytes / GIB, 3),
        "rss_before_load_gib": round(before / GIB, 3),
        "rss_loaded_gib": round(loaded / GIB, 3),
        "peak_rss_while_loading_gib": round(loading_peak / GIB, 3),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20), 3),
        "load_seconds": round(load_seconds, 1),
        "drafter": drafter,
        "plain_tokens_per_second": round(plain.stats.tokens_per_second, 3),
        "speculative_tokens_per_second": round(spec.stats.tokens_per_second, 3),
        "mean_accepted": round(spec.stats.mean_accepted, 3),
        "target_calls": {"plain": plain.stats.target_calls, "speculative": spec.stats.target_calls},
        "prompt_tokens": plain.stats.prompt_tokens,
        "new_tokens": len(plain.token_ids),
        "equal": plain.token_ids == spec.token_ids,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    report = check(args.bundle, args.drafter, args.tokens, args.prompt)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0 if report["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
