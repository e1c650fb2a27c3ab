"""What the decode loop's steppers (runtime/speculative.py) see of the engine: a narrow target, not the engine.

A stepper feeds tokens after the cache and gets their logits, commits a verified path, reads the context it
continues, hands drafters that read hidden states their view, and asks for the call costs and the drafters' records
its controllers start from. EngineTarget gives exactly that over an Engine (runtime/engine.py); a test or another
runtime may give its own object with the same members.
"""

from __future__ import annotations

from typing import Protocol

from specrt.runtime.drafter import TargetView


class DecodeTarget(Protocol):
    draft_limit: int | None  # the most draft tokens one verification may take (a recurrent target's capacity - 1)
    device_verify: bool  # verify with the device kernels on the target's device-resident logits
    grammar_drafts: bool  # under a constraint, the tokens the grammar forces lead each draft
    drafter_records: dict  # drafter name -> its controller's record from earlier requests (runtime/pays.py)

    @property
    def length(self) -> int:
        """Tokens in the target's cache."""

    def feed(self, tokens: list[int], position_ids=None, attention_bias=None, device_logits: bool = False):
        """Run the target on tokens after the cache: logits [len(tokens), V]."""

    def commit(self, base: int, accepted: list[int], draft) -> None:
        """After verifying [pending, *draft] at slot base: keep pending and the accepted path only."""

    def context(self) -> list[int]:
        """The token ids the cache holds, in order (prompt and output so far)."""

    def view(self) -> TargetView:
        """What drafters that read hidden states see of the target."""

    def call_costs(self, max_tokens: int) -> dict:
        """Seconds of one target call by tokens fed, calibrated on this machine (runtime/pays.py)."""


class EngineTarget:
    """DecodeTarget over an Engine: the members the steppers use, and nothing else of it."""

    def __init__(self, engine):
        self._engine = engine
        self.draft_limit = engine.draft_limit
        self.device_verify = engine.device_verify
        self.grammar_drafts = engine.grammar_drafts
        self.drafter_records = engine.pays.drafters

    @property
    def length(self) -> int:
        return self._engine.target.length

    def feed(self, tokens, position_ids=None, attention_bias=None, device_logits=False):
        return self._engine.feed(tokens, position_ids, attention_bias, device_logits)

    def commit(self, base, accepted, draft) -> None:
        self._engine.commit(base, accepted, draft)

    def context(self) -> list[int]:
        return self._engine.cached_tokens()

    def view(self) -> TargetView:
        return self._engine.target_view()

    def call_costs(self, max_tokens: int) -> dict:
        engine = self._engine
        return engine.pays.costs(engine.target, engine.batch_invariant, max_tokens)
