"""Sampling parameters and the numpy sampler (greedy, temperature, top-k, top-p, seeded).

The CPU path needs no torch: logits arrive as numpy from ONNX Runtime. Filtering follows the usual
order (temperature, then top-k, then top-p over the renormalized distribution), as in transformers'
and vLLM's samplers, so the same settings mean the same distribution everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.errors import SpecrtError
from specrt.kernels.verify_ref import row_probs


class SamplingError(SpecrtError):
    """Invalid sampling settings."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings (not included in the output)
    stop_token_ids: tuple[int, ...] | None = None  # None: the bundle's stop ids

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SamplingError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise SamplingError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed < 2 ** 64):
            raise SamplingError(f"seed must be an integer in 0..2^64-1, got {self.seed!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise SamplingError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution sampling draws from: logits [V] -> probabilities [V] (float64). Temperature, then
    top-k (ties at the k-th logit kept), softmax, then top-p (a token is kept iff the tokens strictly more
    likely hold less than top_p): the definition the verification kernel and its twin share."""
    return row_probs(logits, params.temperature, params.top_k, params.top_p)


class Sampler:
    """Draws the next token; one per generation so that a seed reproduces the whole sequence."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:  # logits [V]
        if self.params.greedy:
            return int(np.argmax(logits))
        p = target_probs(logits, self.params)
        return int(self.rng.choice(p.shape[0], p=p))
