"""`auto` on the real default model, in both definitions of lossless (docs/drafters.md, "Lossless"):

- default mode: every emitted token is the target's own greedy choice in the call that verified it (the engine's
  target calls are recorded and the output is derived from their logits alone, independently of the verifier);
- batch-invariant mode: the output equals plain decoding token for token (and at fp32, the default mode does too).
"""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from specrt.runtime.sampling import SamplingParams
from tests.lossless import LOSSLESS_PROMPTS, LOSSLESS_TOKENS, compare_with_plain

pytestmark = pytest.mark.real_model


class FeedLog:
    """Wraps Engine.feed: the tokens of every target call and the argmax of each of its logits rows."""

    def __init__(self, engine):
        self.engine, self.inner, self.calls = engine, engine.feed, []

    def __call__(self, tokens, *args, **kwargs):
        logits = self.inner(tokens, *args, **kwargs)
        self.calls.append((list(tokens), np.asarray(logits).argmax(-1).tolist()))
        return logits


def verified_output(calls: list, prompt_len: int) -> list[int]:
    """The greedy output the recorded calls imply: after the prompt, each call fed [pending, *draft] (a chain); the
    draft's tokens count while they equal the target's choice at the row before, then the target's choice follows."""
    fed, i = 0, 0
    while fed < prompt_len:  # the prefill (in chunks)
        fed += len(calls[i][0])
        i += 1
    out = [calls[i - 1][1][-1]]
    for tokens, best in calls[i:]:
        assert tokens[0] == out[-1]  # the pending token: the last one chosen
        draft, n = tokens[1:], 0
        while n < len(draft) and draft[n] == best[n]:
            n += 1
        out += draft[:n] + [best[n]]
    return out


@pytest.mark.parametrize("precision", ["int4", "fp32"])
def test_auto_emits_only_the_targets_verified_choices(bundles, precision):
    engine = specrt.load(str(bundles[precision]), device="cpu", drafter="auto")
    assert not engine.batch_invariant and engine.target.min_rows == 1
    params = SamplingParams(max_new_tokens=LOSSLESS_TOKENS, stop_token_ids=())
    drafted = 0
    for prompt in LOSSLESS_PROMPTS:
        log = FeedLog(engine)
        engine.feed = log
        try:
            engine.reset()
            result = engine.generate(prompt, params).wait()
        finally:
            del engine.feed
        assert result.token_ids == verified_output(log.calls, len(engine.prompt_ids(prompt)))[:LOSSLESS_TOKENS]
        drafted += sum(result.stats.drafts_by_drafter.values())
    assert drafted > 0  # the check saw verification calls, not only plain steps


def test_auto_equals_plain_decoding_in_batch_invariant_mode(int4_bundle):
    engine = specrt.load(str(int4_bundle), device="cpu", drafter="auto", batch_invariant=True)
    compare_with_plain(engine, lambda prompt, plain: engine.drafter)


def test_auto_at_fp32_equals_plain_decoding(fp32_bundle):
    engine = specrt.load(str(fp32_bundle), device="cpu", drafter="auto")
    compare_with_plain(engine, lambda prompt, plain: engine.drafter)
