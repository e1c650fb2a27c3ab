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

from specrt.runtime.drafter import Draft
from specrt.kernels.verify_ref import verify_tree_ref
from specrt.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]  # indices into the draft, root to leaf
    next_token: int  # recovered token after a rejection, or bonus token after a full path
    bonus: bool


def _random_inputs(n: int, v: int, params: SamplingParams, rng: np.random.Generator):
    """uniforms [1, n] for accept tests, Exp(1) noise [1, V] for the one token sampled (unused when greedy)."""
    if params.greedy:
        return np.zeros((1, n)), np.ones((1, v))
    return rng.random((1, n)), rng.exponential(size=(1, v))


def _verdict(draft: Draft, accepted, count, next_token) -> Verdict:
    path = [int(i) for i in accepted[0, :int(count[0])]]
    leaf = path[-1] if path else -1
    bonus = not any(int(p) == leaf for p in draft.parents)  # the path ended at a node with no children
    return Verdict(path, int(next_token[0]), bonus)


def verify_on_device(draft: Draft, logits, params: SamplingParams, rng: np.random.Generator) -> Verdict:
    """The same verification with the logits left where the target wrote them (a torch tensor [n + 1, V]):
    the fused Triton kernel reads them once; only the draft, the random numbers and the verdict cross."""
    import torch

    from specrt.kernels.verify import verify_tree

    n, v, dev = len(draft), logits.shape[-1], logits.device
    uniforms, noise = _random_inputs(n, v, params, rng)

    def put(x, dtype):
        return torch.as_tensor(np.asarray(x), dtype=dtype).to(dev)

    probs = None if draft.probs is None else put(draft.probs[None], torch.float32)
    out = verify_tree(logits[None], put(draft.tokens[None], torch.int64), put(draft.parents[None], torch.int64),
                      put([n], torch.int64), probs, put([params.temperature], torch.float32),
                      put([params.top_k], torch.int64), put([params.top_p], torch.float32),
                      put(uniforms, torch.float32), put(noise, torch.float32))
    return _verdict(draft, *(t.cpu().numpy() for t in out))  # the one host sync of the step


def verify(draft: Draft, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> Verdict:
    """draft of n tokens; logits [n + 1, V] from one target call over [pending, *draft.tokens]."""
    n, v = len(draft), logits.shape[-1]
    uniforms, noise = _random_inputs(n, v, params, rng)
    probs = None if draft.probs is None else draft.probs[None]
    out = verify_tree_ref(logits[None], draft.tokens[None], draft.parents[None], np.array([n]), probs,
                          np.array([params.temperature]), np.array([params.top_k]), np.array([params.top_p]),
                          uniforms, noise)
    return _verdict(draft, *out)
