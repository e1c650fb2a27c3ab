"""The DFlash drafter trained here for the default model (drafters/dflash/heads/smollm2-135m-instruct, which the
catalog ships): greedy output equals plain decoding on the real model (fp32; tests/lossless.py sets the prompts
and lengths of each tier), with the whole block, the cut by its confidence head and the cut by its probability."""

from __future__ import annotations

import pytest

import specrt
from tests.conftest import DFLASH_HEAD
from tests.lossless import assert_both_paths, compare_with_plain

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def dflash_engine(fp32_bundle):
    from specrt.bundle import load_bundle

    entry = load_bundle(fp32_bundle).drafter("dflash")
    assert entry.source == str(DFLASH_HEAD) and entry.raw["validation"]["max_abs_diff"] < 1e-3
    assert entry.raw["draft_vocab_size"] == 8192  # the shipped drafter predicts over the 8192 most frequent tokens
    return specrt.load(str(fp32_bundle), device="cpu", drafter="dflash")


@pytest.mark.parametrize("mode", ["whole-block", "adaptive-cut", "adaptive-prob-cut"])
def test_dflash_greedy_equals_plain(dflash_engine, mode):
    engine = dflash_engine
    assert engine.drafter.has_head  # the shipped drafter carries its confidence head
    # adaptive: the controller's length, then the cut by the confidence head's estimate (adaptive-cut) or by the
    # draft's own probability (adaptive-prob-cut)
    engine.adaptive = mode != "whole-block"
    engine.drafter.use_mode("prob" if mode == "adaptive-prob-cut" else "head")
    outcome = compare_with_plain(engine, lambda prompt, plain: engine.drafter)
    if mode == "whole-block":  # the trained drafter gets some of its blocks accepted, and some rejected
        assert_both_paths(outcome)
