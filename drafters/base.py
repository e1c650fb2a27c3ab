"""What every drafter gives the draft-verify loop: a Draft (tokens + parent per token + optional q).

A chain is the special case parents = [-1, 0, 1, ...]; parent -1 means "follows the pending token" (the
last token already chosen but not yet verified by the target). `probs[i]` is the draft distribution the
i-th token was sampled from (over the target vocabulary); None means the drafter has none (n-gram,
greedy drafting), which the verifier treats as one-hot on the drafted token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Draft:
    tokens: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64, -1 for children of the pending token; parents[i] < i
    probs: np.ndarray | None = None  # [n, V] float

    @staticmethod
    def chain(tokens, probs=None) -> "Draft":
        tokens = np.asarray(tokens, dtype=np.int64)
        return Draft(tokens, np.arange(len(tokens), dtype=np.int64) - 1, probs)

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> np.ndarray:
        """Depth of each token below the pending token (children of the pending token have depth 1)."""
        d = np.zeros(len(self.tokens), dtype=np.int64)
        for i, p in enumerate(self.parents):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parents, np.arange(len(self.tokens)) - 1))


class Drafter(Protocol):
    name: str

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        """A draft continuing `context` (prompt + output, ending with the pending token), or None."""

    def reset(self, params=None, rng=None) -> None:
        """Start a generation with these SamplingParams and random generator (drafters that sample use both)."""
