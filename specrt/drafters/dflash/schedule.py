"""Confidence-scheduled draft length, in the spirit of DSpark: cut the drafted block where the expected gain
stops paying for the verification cost measured on this machine.

A block drafter proposes up to k tokens at once, each with its own confidence c_i (the draft's probability of
its token at position i). If the target accepts position i with probability about c_i given that it accepted
the ones before, a draft cut after j tokens yields 1 + c_1 + c_1 c_2 + ... + c_1...c_j tokens per target call,
which costs seconds(j + 1) (the call feeds the pending token plus j drafts). The cut is the j in 1..k with the
best ratio: never zero, because the caller (the adaptive controller) already decided that drafting pays here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def expected_tokens(confidence: Sequence[float], j: int) -> float:
    total, reach = 1.0, 1.0
    for c in confidence[:j]:
        reach *= float(c)
        total += reach
    return total


def cut_length(confidence: Sequence[float], seconds: Callable[[int], float], k: int) -> int:
    """Draft tokens to keep (1..k, k >= 1): maximizes expected tokens per second of the verification call."""
    k = max(1, min(k, len(confidence)))
    best, best_rate = 1, expected_tokens(confidence, 1) / seconds(2)
    for j in range(2, k + 1):
        rate = expected_tokens(confidence, j) / seconds(j + 1)
        if rate > best_rate:
            best, best_rate = j, rate
    return best
