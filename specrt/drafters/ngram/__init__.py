"""Prompt-lookup (n-gram) drafting: no graph, no training."""

from specrt.drafters.ngram.proposer import NgramDrafter

__all__ = ["NgramDrafter"]
