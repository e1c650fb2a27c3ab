"""What a generation returns: a Generation streams text chunks, then holds a GenerationResult with its stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class GenerationStats:
    new_tokens: int
    prompt_tokens: int
    reused_tokens: int  # prompt tokens whose KV was already cached
    target_calls: int
    mean_accepted: float  # new tokens per target call after prefill (1.0 for plain decoding)
    tokens_per_second: float  # decode speed, first new token to last
    prefill_seconds: float
    drafter: str = "none"
    acceptance_by_position: list = field(default_factory=list)  # share of drafts accepted at depth 1, 2, ...
    drafted_by_position: list = field(default_factory=list)  # how many drafts reached depth 1, 2, ...
    accepted_by_position: list = field(default_factory=list)  # how many drafts were accepted to depth 1, 2, ...
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # target calls after prefill (verification, or plain decode steps)
    drafts_by_drafter: dict = field(default_factory=dict)  # verified drafts per drafter (a mix has several)
    forced_drafted: int = 0  # tokens the grammar forced at the head of drafts (constrained output)
    forced_accepted: int = 0  # of those, accepted

    @property
    def acceptance_length(self) -> float | None:
        """Mean acceptance length in vLLM's and SGLang's unit: 1 + accepted draft tokens / drafts verified (the
        tokens a drafting step yields). Unlike mean_accepted it leaves out steps that drafted nothing. None: no
        draft was verified."""
        drafts = self.drafted_by_position[0] if self.drafted_by_position else 0
        return 1.0 + sum(self.accepted_by_position) / drafts if drafts else None

    def as_dict(self) -> dict:
        return {**self.__dict__, "acceptance_length": self.acceptance_length}


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    stats: GenerationStats
    tool_calls: list | None = None  # OpenAI's [{"id", "type": "function", "function": {"name", "arguments"}}]
    reasoning: str | None = None  # a request with tools: the thought read apart from text (runtime/reasoning.py)


class Generation:
    """Iterator of text chunks; `.result` is set once the iteration ends (or `.wait()` runs it out)."""

    def __init__(self, chunks: Iterator[str]):
        self._chunks = chunks
        self.result: GenerationResult | None = None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._chunks)

    def wait(self) -> GenerationResult:
        for _ in self:
            pass
        return self.result

    def close(self) -> None:
        self._chunks.close()
