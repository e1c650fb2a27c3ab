"""Issue 21's overfit check: the DFlash recipe memorizes a handful of sequences of the real default model.

Two sequences of 64 tokens, every anchor in every step, the shipped recipe otherwise (one layer started from
the target's last layer, candidate softmax, confidence weights): top-1 agreement with the target reaches 0.9 at
block positions 1-4 on those sequences within 150 steps. (Random anchors, 64 of them per step, present each
example only a few times in a short run: that, not the recipe, was why an earlier 16-sequence run stayed near
zero.) Full tier: about five minutes on two cores."""

from __future__ import annotations

import sys

import pytest

from tests.memory_limited_convert import ROOT

pytestmark = [pytest.mark.real_model, pytest.mark.full]


def test_dflash_recipe_memorizes_two_sequences():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import dflash_overfit
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    history = dflash_overfit.overfit(dflash_overfit.parse(["--steps", "150", "--every", "25"]), log=lambda *_: None)
    best = max(min(agree[:4]) for _, agree in history)
    assert best >= 0.9, history
    assert min(history[0][1][:4]) < 0.9  # it learned: the first evaluation was not there yet


def test_eagle3_recipe_memorizes_the_same_sequences():
    """The control: the EAGLE-3 trainer's head on the same two sequences, >= 0.9 at each of its three draft
    steps within 100 steps (about a minute)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import dflash_overfit
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    args = dflash_overfit.parse(["--kind", "eagle3", "--steps", "100", "--every", "25"])
    history = dflash_overfit.overfit(args, log=lambda *_: None)
    assert max(min(agree) for _, agree in history) >= 0.9, history
