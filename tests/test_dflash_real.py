"""The DFlash drafter trained here for the default model (drafters/dflash/heads/smollm2-135m-instruct, which the
catalog ships): greedy output equals plain decoding on 10 prompts x 128 tokens on the real model (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest

import specrt
from tests.test_speculative_real import _compare_with_plain

pytestmark = pytest.mark.real_model

DFLASH = Path(__file__).resolve().parent.parent / "drafters" / "dflash" / "heads" / "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def dflash_engine(tmp_path_factory):
    from specrt.bundle import load_bundle
    from specrt.cli import main

    out = tmp_path_factory.mktemp("dflash") / "fp32-dflash"
    assert main(["convert", "smollm2-135m-instruct", "-o", str(out), "--drafter", f"dflash:{DFLASH}"]) == 0
    entry = load_bundle(out).drafter("dflash")
    assert entry["source"] == str(DFLASH) and entry["validation"]["max_abs_diff"] < 1e-3
    assert entry["draft_vocab_size"] == 8192  # the shipped drafter predicts over the 8192 most frequent tokens
    return specrt.load(str(out), device="cpu", drafter="dflash")


@pytest.mark.parametrize("mode", ["whole-block", "adaptive-cut"])
def test_dflash_greedy_equals_plain_on_10_prompts(dflash_engine, mode):
    engine = dflash_engine
    engine.adaptive = mode == "adaptive-cut"  # adaptive: the controller's length, then the confidence cut
    mean = _compare_with_plain(engine, lambda prompt, plain: engine.drafter)
    assert mean > (1.05 if mode == "whole-block" else 1.0)  # the trained drafter gets some of its blocks accepted
