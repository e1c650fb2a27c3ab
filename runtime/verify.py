"""Lossless verification of a draft (chain or tree) against the target's logits, in numpy.

Terms as in vLLM's rejection sampler: accepted tokens (a prefix of a chain, a root path of a tree), the
recovered token (drawn from the residual max(p - q, 0) after a rejection; at temperature 0 simply the
target's argmax) and the bonus token (the target's next token after a fully accepted path).

Temperature 0: a draft token is accepted iff it equals the target's argmax, so the output is plain greedy
decoding token for token. Temperature > 0: Leviathan et al. / Chen et al. rejection sampling; at a tree node
the children are tried in order, each rejection replacing p by the normalized residual (the multi-draft
recursive form of SpecInfer), which is exact for one-hot drafts and for children drawn i.i.d. from q.
`logits[0]` is the target's prediction after the pending token, `logits[i + 1]` after draft token i.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.drafters.base import Draft
from specrt.runtime.sampling import SamplingParams, target_probs


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]  # indices into the draft, root to leaf
    next_token: int  # recovered token after a rejection, or bonus token after a full path
    bonus: bool


def _children(draft: Draft) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(draft.parents.tolist()):
        kids.setdefault(int(p), []).append(i)
    return kids


def verify(draft: Draft, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> Verdict:
    """draft of n tokens; logits [n + 1, V] from one target call over [pending, *draft.tokens]."""
    kids = _children(draft)
    accepted: list[int] = []
    node, row = -1, 0
    while True:
        children = kids.get(node, [])
        if params.greedy:
            choice = int(np.argmax(logits[row]))
            match = next((c for c in children if int(draft.tokens[c]) == choice), None)
            if match is None:
                return Verdict(accepted, choice, bonus=not children)
            accepted.append(match)
            node, row = match, match + 1
            continue
        p = target_probs(logits[row], params)
        if not children:
            return Verdict(accepted, int(rng.choice(p.shape[0], p=p)), bonus=True)
        taken = None
        for c in children:
            x = int(draft.tokens[c])
            if draft.probs is None:
                q = np.zeros_like(p)
                q[x] = 1.0
            else:
                q = draft.probs[c].astype(np.float64)
            if q[x] > 0 and rng.random() < min(1.0, p[x] / q[x]):
                taken = c
                break
            residual = np.maximum(p - q, 0.0)
            total = residual.sum()
            if total <= 0:  # p == q: a rejection has probability 0; keep p
                continue
            p = residual / total
        if taken is None:
            return Verdict(accepted, int(rng.choice(p.shape[0], p=p)), bonus=False)
        accepted.append(taken)
        node, row = taken, taken + 1
