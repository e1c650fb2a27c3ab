"""Greedy losslessness of the draft-verify loop on the real model (fp32 bundle): for the n-gram drafter,
a drafter that is always right and one that is always wrong, 10 prompts x 128 tokens equal plain decoding.

(The int4 bundle is not batch-invariant: MatMulNBits with int8 activations rounds differently for one
token than for several, so even plain decoding's output depends on how the prompt was chunked; see
docs/perf.md. Losslessness there needs batch-invariant kernels, an open part of the speculative issue.)"""

from __future__ import annotations

import pytest

import specrt
from specrt.drafters.ngram import NgramDrafter
from specrt.runtime.sampling import SamplingParams
from tests.oracle_drafters import OracleDrafter
from tests.test_runtime_real import PROMPTS

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def engine(bundles):
    return specrt.load(str(bundles["fp32"]), device="cpu")


@pytest.mark.parametrize("mode", ["ngram", "right", "wrong"])
def test_greedy_speculative_equals_plain_on_10_prompts(engine, mode):
    engine.adaptive = mode == "ngram"  # fixed draft length where the test counts accepted tokens
    params = SamplingParams(max_new_tokens=128, stop_token_ids=())
    accepted = []
    for prompt in PROMPTS:
        engine.reset()
        plain = engine.generate(prompt, params, drafter=None).wait()
        engine.reset()
        n = len(engine.prompt_ids(prompt))
        drafter = NgramDrafter() if mode == "ngram" else OracleDrafter(n, plain.token_ids, engine.manifest.vocab_size, mode)
        spec = engine.generate(prompt, params, drafter=drafter).wait()
        assert spec.token_ids == plain.token_ids, prompt
        accepted.append(spec.stats.mean_accepted)
    mean = sum(accepted) / len(accepted)
    if mode == "right":
        assert mean > 4.0  # max_draft 4: nearly every call yields 5 tokens
    elif mode == "wrong":
        assert mean == pytest.approx(1.0)
    else:
        assert mean > 1.0
