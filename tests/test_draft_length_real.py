"""A fixed draft length (`--draft-length K`, adaptive off), as vLLM and SGLang draft a fixed num_speculative_tokens,
and the mean acceptance length in their unit (1 + accepted / drafts) beside specrt's tokens per target call."""

from __future__ import annotations

import json

import pytest

import specrt
from specrt.errors import SpecrtError
from specrt.runtime.generation import GenerationStats
from specrt.runtime.sampling import SamplingParams
from tests.lossless import PROMPTS

pytestmark = pytest.mark.real_model


def test_acceptance_length_counts_drafts_not_calls():
    # 10 target calls, 4 of them verified a 3-token draft: 3 accepted at depth 1, 2 at depth 2, 1 at depth 3
    stats = GenerationStats(new_tokens=16, prompt_tokens=5, reused_tokens=0, target_calls=10, mean_accepted=1.6,
                            tokens_per_second=1.0, prefill_seconds=0.1, drafted_by_position=[4, 4, 4],
                            accepted_by_position=[3, 2, 1])
    assert stats.acceptance_length == pytest.approx(1 + 6 / 4)
    assert stats.as_dict()["acceptance_length"] == pytest.approx(2.5)
    plain = GenerationStats(new_tokens=3, prompt_tokens=5, reused_tokens=0, target_calls=3, mean_accepted=1.0,
                            tokens_per_second=1.0, prefill_seconds=0.1)
    assert plain.acceptance_length is None


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_fixed_draft_length_drafts_k_every_call_and_stays_lossless(fp32_bundle, drafter):
    k, params = 3, SamplingParams(max_new_tokens=40, temperature=0.0)
    fixed = specrt.load(str(fp32_bundle), device="cpu", drafter=drafter, draft_length=k)
    plain = specrt.load(str(fp32_bundle), device="cpu", drafter="none")
    for prompt in PROMPTS[:2]:
        want = plain.generate(prompt, params).wait()
        got = fixed.generate(prompt, params).wait()
        assert got.token_ids == want.token_ids
        s = got.stats
        drafts = s.drafted_by_position[0]
        assert len(s.drafted_by_position) == k  # never deeper than K (the DFlash block is cut to K, not by confidence)
        # every decode call drafts K, except the last few where fewer tokens are left than K + 1
        assert drafts >= s.target_calls - 1 - k and s.drafted_by_position[k - 1] >= drafts - k
        assert s.acceptance_length == pytest.approx(1 + sum(s.accepted_by_position) / drafts)


def test_draft_length_refusals(fp32_bundle):
    with pytest.raises(SpecrtError, match="at least 1"):
        specrt.load(str(fp32_bundle), device="cpu", drafter="eagle3", draft_length=0)
    with pytest.raises(SpecrtError, match="no drafter"):
        specrt.load(str(fp32_bundle), device="cpu", drafter="none", draft_length=3)
    with pytest.raises(SpecrtError, match="at most 7"):  # block size 8
        specrt.load(str(fp32_bundle), device="cpu", drafter="dflash", draft_length=8)


def test_generate_json_reports_both_units(fp32_bundle, capsys):
    from specrt.cli import main

    assert main(["generate", str(fp32_bundle), "--prompt", PROMPTS[0], "--drafter", "eagle3", "--draft-length", "2",
                 "--max-new-tokens", "24", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    drafts, accepted = stats["drafted_by_position"][0], sum(stats["accepted_by_position"])
    assert len(stats["drafted_by_position"]) == 2
    assert stats["acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert stats["mean_accepted"] <= stats["acceptance_length"] + 1e-9  # calls without a draft count in specrt's unit
