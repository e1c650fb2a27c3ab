"""Drafters for losslessness tests: one that always proposes the plain greedy continuation, one that is
always wrong, and one that drafts a tree whose branches hold both."""

from __future__ import annotations

import numpy as np

from specrt.runtime.drafter import Draft, Drafter


class OracleDrafter(Drafter):
    """Knows the plain greedy output for one prompt; proposes it (right) or shifted tokens (wrong)."""

    def __init__(self, prompt_len: int, greedy: list[int], vocab: int, mode: str = "right"):
        self.prompt_len, self.greedy, self.vocab, self.mode = prompt_len, greedy, vocab, mode
        self.name = f"oracle-{mode}"

    def reset(self, params=None, rng=None) -> None:
        pass

    def _truth(self, context: list[int], k: int) -> list[int]:
        done = len(context) - self.prompt_len  # output tokens so far (the pending one included)
        return self.greedy[done:done + k]

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        truth = self._truth(context, max_tokens)
        if not truth:
            return None
        if self.mode == "right":
            return Draft.chain(truth)
        wrong = [(t + 1) % self.vocab for t in truth]
        if self.mode == "wrong":
            return Draft.chain(wrong)
        # tree: a wrong chain first, then the right chain as a second branch, then a wrong leaf under it
        n = len(truth)
        tokens = wrong + truth + [wrong[0]]
        parents = list(range(-1, n - 1)) + [-1] + list(range(n, 2 * n - 1)) + [n]
        return Draft(np.array(tokens), np.array(parents))
