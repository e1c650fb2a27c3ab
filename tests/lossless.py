"""Greedy losslessness on the real model, shared by every drafter's test: speculative output equals plain decoding
token for token, from a reset cache each time.

The default tier runs 3 prompts x 48 tokens per drafter configuration: prompts on which the real drafters get
drafts both accepted and rejected, so both paths of the verifier run. The full tier (SPECRT_FULL=1) runs the
10 prompts x 128 tokens of the long matrices. Plain decoding's output depends only on the bundle and the call
shapes (batch-invariant or not), so it is computed once per prompt and shared by every configuration."""

from __future__ import annotations

from dataclasses import dataclass

from specrt.runtime.sampling import SamplingParams
from tests.conftest import FULL

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I sort a list in Python?",
    "Name three planets of the solar system.",
    "What is the boiling point of water?",
    "Give me a tip for learning a new language.",
    "Who wrote Romeo and Juliet?",
    "Explain what a prime number is.",
    "Suggest a name for a pet cat.",
    "What is 15 plus 27?",
)
# where every real drafter (ngram, draft model, EAGLE-3, DFlash) has drafts both accepted and rejected in 48 tokens
QUICK_PROMPTS = (PROMPTS[1], PROMPTS[2], PROMPTS[7])
LOSSLESS_PROMPTS, LOSSLESS_TOKENS = (PROMPTS, 128) if FULL else (QUICK_PROMPTS, 48)

_plain_cache: dict[tuple, list[int]] = {}


@dataclass(frozen=True)
class Outcome:
    mean_accepted: float  # mean over prompts of new tokens per target call
    drafted: int  # draft tokens proposed at depth 1, over all prompts
    accepted: int  # of those, accepted


def plain_tokens(engine, prompt: str, params: SamplingParams) -> list[int]:
    key = (str(engine.bundle_dir), engine.batch_invariant, prompt, params.max_new_tokens)
    if key not in _plain_cache:
        engine.reset()
        _plain_cache[key] = engine.generate(prompt, params, drafter=None).wait().token_ids
    return _plain_cache[key]


def compare_with_plain(engine, drafter_for, prompts=None, new_tokens=None) -> Outcome:
    """Greedy new_tokens per prompt, plain then speculative (drafter_for(prompt, plain token ids)), each from a
    reset cache; asserts equal output."""
    prompts, new_tokens = prompts or LOSSLESS_PROMPTS, new_tokens or LOSSLESS_TOKENS
    params = SamplingParams(max_new_tokens=new_tokens, stop_token_ids=())
    means, drafted, accepted = [], 0, 0
    for prompt in prompts:
        plain = plain_tokens(engine, prompt, params)
        engine.reset()
        spec = engine.generate(prompt, params, drafter=drafter_for(prompt, plain)).wait()
        assert spec.token_ids == plain, f"{prompt!r}: diverged at token " + str(
            next((i for i, (a, b) in enumerate(zip(spec.token_ids, plain)) if a != b), len(plain)))
        means.append(spec.stats.mean_accepted)
        if spec.stats.drafted_by_position:
            n = spec.stats.drafted_by_position[0]
            drafted += n
            accepted += round(n * spec.stats.acceptance_by_position[0])
    return Outcome(sum(means) / len(means), drafted, accepted)


def assert_both_paths(outcome: Outcome) -> None:
    """A real drafter's run saw drafts accepted and drafts rejected (both paths of the verifier ran)."""
    assert 0 < outcome.accepted < outcome.drafted, outcome
