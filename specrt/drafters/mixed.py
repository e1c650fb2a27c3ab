"""Several drafters behind one name ("draft-model+ngram"): the adaptive loop picks one per step.

Each member keeps its own acceptance and drafting-cost estimates (one DraftController each, sharing the
target's measured call costs); every step the stepper asks the members in order of expected tokens per second
and takes the first draft offered. Prompt lookup costs almost nothing and offers a draft only where the
context repeats itself (code edits, quoting), so a draft model fills the other steps.
"""

from __future__ import annotations

from specrt.runtime.drafter import Drafter


class MixedDrafter(Drafter):
    def __init__(self, members: list[Drafter]):
        if len(members) < 2:
            raise ValueError("a mixed drafter needs at least two members")
        self._members = list(members)
        self.name = "+".join(m.name for m in self.members)

    def reset(self, params=None, rng=None) -> None:
        for m in self.members:
            m.reset(params, rng)

    @property
    def members(self) -> list[Drafter]:
        return self._members

    def prefill(self, prompt: list[int]) -> None:
        for m in self.members:
            m.prefill(prompt)

    def remember(self, tokens: list[int]) -> None:
        for m in self.members:
            m.remember(tokens)

    def propose(self, context: list[int], max_tokens: int):
        """Outside the adaptive loop: the first member's draft that exists."""
        for m in self.members:
            draft = m.propose(context, max_tokens)
            if draft is not None and len(draft):
                return draft
        return None
