"""Trace `auto` on a bundle: every draft it makes (member, length, seconds, tokens it caught up on, each member's
probe interval), and plain vs auto per prompt with the target calls' own time, alternating in one process.

    python scripts/auto_trace.py BUNDLE [DATASET] [PROMPTS]

A warm-up request runs first with auto, as `specrt bench`'s does (each member's first draft happens there).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(bundle: str, dataset: str = "gsm8k", count: int = 3) -> None:
    import specrt
    import specrt.runtime.speculative as speculative
    from specrt.app.api import make_drafter
    from specrt.datasets import load_prompts
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(bundle, device="cpu")
    auto = make_drafter("auto", Path(bundle), engine.manifest, ["CPUExecutionProvider"])
    drafts = []
    propose = speculative.SpeculativeStepper._propose

    def traced(stepper, budget):  # the stepper's own choice, timed and recorded
        t = time.perf_counter()
        out = propose(stepper, budget)
        if out is not None:
            member, draft, _, caught = out[:4]
            drafts.append((stepper.members[member].name, len(draft), round(time.perf_counter() - t, 3), caught,
                           [c.probe_due() for c in stepper.controllers]))
        return out

    speculative.SpeculativeStepper._propose = traced
    prompts = load_prompts(dataset=dataset, limit=count)
    engine.generate(prompts[0], SamplingParams(max_new_tokens=8, stop_token_ids=()), drafter=auto).wait()
    print("warm-up drafts:", drafts)
    drafts.clear()
    params = SamplingParams(max_new_tokens=128, stop_token_ids=())
    for i, prompt in enumerate(prompts):
        engine.reset()
        plain = engine.generate(prompt, params, drafter=None).wait().stats
        engine.reset()
        spec = engine.generate(prompt, params, drafter=auto).wait().stats
        print(f"prompt {i + 1}: plain {plain.tokens_per_second:.2f} tok/s, auto {spec.tokens_per_second:.2f} "
              f"({spec.tokens_per_second / plain.tokens_per_second:.3f}x); target calls: plain {plain.verify_seconds:.2f} s, "
              f"auto {spec.verify_seconds:.2f} s ({spec.target_calls} calls), auto drafting {spec.draft_seconds:.2f} s",
              flush=True)
        print("  drafts:", drafts, flush=True)
        drafts.clear()


if __name__ == "__main__":
    main(sys.argv[1], *(sys.argv[2:3]), *(int(a) for a in sys.argv[3:4]))
