"""EAGLE-3 drafting: a one-layer head over the target's hidden states, with its own KV cache."""

from specrt.drafters.eagle3.drafter import Eagle3Drafter

__all__ = ["Eagle3Drafter"]
