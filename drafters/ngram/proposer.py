"""Prompt lookup decoding (Saxena, 2023; llama.cpp's and transformers' prompt-lookup mode).

The longest suffix of the context (n from max_n down to min_n tokens) that occurred earlier is looked up,
most recent occurrence first, and the tokens that followed it become a chain draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.runtime.drafter import Draft, Drafter


@dataclass
class NgramDrafter(Drafter):
    max_n: int = 3
    min_n: int = 1
    name: str = "ngram"

    def reset(self, params=None, rng=None) -> None:
        pass

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        if max_tokens < 1 or len(context) < self.min_n + 1:
            return None
        ctx = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_n, len(ctx) - 1), self.min_n - 1, -1):
            suffix = ctx[-n:]
            # windows over ctx[:-1] so that the match is followed by at least one token
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.nonzero((windows == suffix).all(axis=1))[0]
            if len(hits):
                start = int(hits[-1]) + n
                follow = ctx[start:start + max_tokens]
                if len(follow):
                    return Draft.chain(follow)
        return None
