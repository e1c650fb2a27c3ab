"""A drafter for measurements, not a product drafter: it proposes plain decoding's own greedy continuation with
errors injected at a set rate, so the runtime's real speed at a published acceptance (llama.cpp's MTP on
Qwen3.6-27B: 74 %) can be measured on random-weight real-size models, whose own drafters accept nothing.

Each draft token is right with probability `acceptance`, independently (a wrong token is the right one + 1), so a
one-token draft is accepted at that rate and a k-token chain keeps a geometric prefix of it. Wrapping a real drafter
(`inner`, e.g. the bundle's MTP module) runs that drafter for every draft and then replaces its tokens: the time
measured is the real drafter's cost plus the target's at the stated acceptance. Seeded: two runs draft alike.

    from scripts.replay_drafter import ReplayDrafter
    drafter = ReplayDrafter(prompt_len, plain_tokens, vocab, acceptance=0.74, inner=engine.drafter)
"""

from __future__ import annotations

import numpy as np

from specrt.runtime.drafter import Draft, Drafter


class ReplayDrafter(Drafter):
    def __init__(self, prompt_len: int, greedy: list[int], vocab: int, acceptance: float, inner: Drafter | None = None,
                 seed: int = 0):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError("acceptance is a probability")
        self.prompt_len, self.greedy, self.vocab, self.acceptance = prompt_len, list(greedy), vocab, acceptance
        self.inner, self.seed = inner, seed
        self.rng = np.random.default_rng(seed)
        self.name = f"replay-{acceptance:.0%}" + (f"({inner.name})" if inner is not None else "")
        self.max_draft = inner.max_draft if inner is not None else None
        self.reads_hidden_states = inner is not None and inner.reads_hidden_states

    def bind(self, target) -> None:
        if self.inner is not None:
            self.inner.bind(target)

    def use_costs(self, seconds) -> None:
        if self.inner is not None:
            self.inner.use_costs(seconds)

    def reset(self, params=None, rng=None) -> None:
        self.rng = np.random.default_rng(self.seed)
        if self.inner is not None:
            self.inner.reset(params, rng)

    def prefill(self, prompt: list[int]) -> None:
        if self.inner is not None:
            self.inner.prefill(prompt)

    def backlog(self, context: list[int]) -> int:
        return self.inner.backlog(context) if self.inner is not None else 0

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        done = len(context) - self.prompt_len  # output tokens so far (the pending one included)
        truth = self.greedy[done:done + max_tokens]
        if not truth:
            return None
        if self.inner is not None:  # pay the real drafter's cost (and keep its caches in step)
            real = self.inner.propose(context, len(truth))
            if real is None:
                return None
            truth = truth[:len(real)]
        right = self.rng.random(len(truth)) < self.acceptance
        return Draft.chain([t if ok else (t + 1) % self.vocab for t, ok in zip(truth, right)])


if __name__ == "__main__":  # a module for scripts/bench_qwen35.py: run alone, it says what it is
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(__doc__)
