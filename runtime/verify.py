"""Lossless verification of one draft (chain or tree) against the target's logits, on the host.

Terms as in vLLM's rejection sampler: accepted tokens (a prefix of a chain, a root path of a tree), the
recovered token (drawn from the residual max(p - q, 0) after a rejection; at temperature 0 simply the
target's argmax) and the bonus token (the target's next token after a fully accepted path). The rule
itself lives in the kernels' CPU twin (kernels/verify_ref.py), so the CPU runtime and the Triton kernel
share one definition; this wrapper draws its random numbers and unpacks one request.
`logits[0]` is the target's prediction after the pending token, `logits[i + 1]` after draft token i.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.drafters.base import Draft
from specrt.kernels.verify_ref import verify_tree_ref
from specrt.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]  # indices into the draft, root to leaf
    next_token: int  # recovered token after a rejection, or bonus token after a full path
    bonus: bool


def verify(draft: Draft, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> Verdict:
    """draft of n tokens; logits [n + 1, V] from one target call over [pending, *draft.tokens]."""
    n, v = len(draft), logits.shape[-1]
    if params.greedy:
        uniforms, noise = np.zeros((1, n)), np.ones((1, v))
    else:
        uniforms, noise = rng.random((1, n)), rng.exponential(size=(1, v))
    probs = None if draft.probs is None else draft.probs[None]
    accepted, count, next_token = verify_tree_ref(
        logits[None], draft.tokens[None], draft.parents[None], np.array([n]), probs,
        np.array([params.temperature]), np.array([params.top_k]), np.array([params.top_p]), uniforms, noise)
    path = accepted[0, :count[0]].tolist()
    leaf = path[-1] if path else -1
    bonus = not any(int(p) == leaf for p in draft.parents)  # the path ended at a node with no children
    return Verdict(path, int(next_token[0]), bonus)
