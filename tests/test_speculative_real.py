"""Greedy losslessness of the draft-verify loop on the real model, every drafter on the shared bundles: at fp32 the
n-gram drafter, the draft model (the model's own int4 graph, self-int4), their adaptive mix, the shipped EAGLE-3
head (chain and tree, fixed and adaptive), a drafter that is always right and one that is always wrong; at int4
(batch-invariant calls) the n-gram drafter, the EAGLE-3 head, right and wrong. Each equals plain decoding token for
token (tests/lossless.py: 3 prompts x 48 tokens in the default tier, 10 x 128 in the full tier).

(A one-token call's attention rounds differently from a multi-token call's, and an int4 graph's int8 activations
turn that into different tokens; batch-invariant mode runs one-token calls' attention on two rows, so speculation
there equals plain decoding. The default mode's own guarantee is tests/test_auto_real.py's.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import specrt
from specrt.drafters.ngram import NgramDrafter
from specrt.app.api import make_drafter
from tests.conftest import EAGLE3_HEAD, FULL
from tests.lossless import PROMPTS, assert_both_paths, compare_with_plain
from tests.oracle_drafters import OracleDrafter

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def engine(fp32_bundle):
    return specrt.load(str(fp32_bundle), device="cpu", drafter="draft-model")


def _drafter(engine, mode, prompt, plain):
    if mode == "ngram":
        return NgramDrafter()
    return OracleDrafter(len(engine.prompt_ids(prompt)), plain, engine.manifest.vocab_size, mode)


@pytest.mark.parametrize("mode", ["ngram", "ngram:history", "draft-model", "draft-model+ngram",
                                  "draft-model+ngram:history", "right", "wrong"])
def test_fp32_greedy_speculative_equals_plain(engine, mode):
    # every drafter at a fixed draft length (4), every call drafting: left to the adaptive controller, a drafter drafts
    # as this machine's measured timings say (a draft-model mix once drafted a single token in 144, prompt lookup
    # alone 3 tokens in a whole run: both paths of the verifier then not run), and timing must not decide a test;
    # the adaptive controller's own losslessness is tests/test_auto_real.py's
    engine.adaptive = False
    # one drafter for every prompt: a draft model keeps its graph session, ngram:history its store of the
    # earlier prompts' generations
    if mode.startswith("draft-model") or mode.endswith(":history"):
        model = engine.drafter if mode == "draft-model" else make_drafter(mode, engine.bundle_dir, engine.manifest,
                                                                           engine.providers)
        outcome = compare_with_plain(engine, lambda prompt, plain: model)
    else:
        outcome = compare_with_plain(engine, lambda prompt, plain: _drafter(engine, mode, prompt, plain))
    if mode == "right":
        assert outcome.mean_accepted > 4.0  # max_draft 4: nearly every call yields 5 tokens
    elif mode == "wrong":
        assert outcome.mean_accepted == pytest.approx(1.0) and outcome.accepted == 0
    else:
        assert_both_paths(outcome)
        if mode == "draft-model":
            assert outcome.mean_accepted > 2.0  # the int4 graph agrees with the fp32 one most of the time


@pytest.fixture(scope="module")
def eagle3_engine(fp32_bundle):
    """The fp32 default model with the EAGLE-3 head trained by `specrt train-drafter` (committed, fp16), which
    the catalog adds by default."""
    from specrt.bundle import load_bundle

    assert load_bundle(fp32_bundle).drafter("eagle3").source == str(EAGLE3_HEAD)
    return specrt.load(str(fp32_bundle), device="cpu", drafter="eagle3")


@pytest.mark.parametrize("mode", ["chain", "chain-adaptive", "tree", "tree-adaptive"])
def test_eagle3_greedy_equals_plain(eagle3_engine, mode):
    engine = eagle3_engine
    engine.adaptive = mode.endswith("adaptive")
    if mode.startswith("tree"):
        engine.drafter.use_tree()
    else:
        engine.drafter.topk, engine.drafter.max_draft = 1, None
    outcome = compare_with_plain(engine, lambda prompt, plain: engine.drafter)
    if not engine.adaptive:  # drafting every call: the trained head (held-back top-1 ~30%) gets tokens accepted
        assert_both_paths(outcome)
        if FULL:  # over the long matrix, not 3 short answers
            assert outcome.mean_accepted > (1.3 if mode == "tree" else 1.15)


@pytest.mark.parametrize("mode", ["ngram", "eagle3", "right", "wrong"])
def test_int4_batch_invariant_speculation_equals_plain(int4_bundle, mode):
    """int4: one-token calls round differently from multi-token ones, so lossless speculation runs the engine
    batch-invariant (every call >= 2 rows); then output equals plain decoding token for token."""
    engine = specrt.load(str(int4_bundle), device="cpu", batch_invariant=True)
    engine.adaptive = mode == "ngram"
    if mode == "eagle3":
        head = make_drafter("eagle3", engine.bundle_dir, engine.manifest, engine.providers)
        outcome = compare_with_plain(engine, lambda prompt, plain: head)
        assert_both_paths(outcome)
    else:
        compare_with_plain(engine, lambda prompt, plain: _drafter(engine, mode, prompt, plain))


def test_batch_invariance_is_asked_for_and_pads_only_the_attention(bundles):
    """By default no call is padded, with a drafter or without; batch-invariant mode on these graphs (blocks of 32,
    the attention_min_rows input) pads one-token calls inside the attention only."""
    for precision, drafter in (("int4", "ngram"), ("int4", "auto"), ("int4", None), ("fp32", "ngram")):
        target = specrt.load(str(bundles[precision]), device="cpu", drafter=drafter).target
        assert (target.min_rows, target.attention_min_rows) == (1, 1)
    engine = specrt.load(str(bundles["int4"]), device="cpu", drafter="auto", batch_invariant=True)
    assert engine.rows_invariant and (engine.target.min_rows, engine.target.attention_min_rows) == (1, 2)


def test_default_int4_bundle_drafts_with_its_drafters_by_default(int4_bundle):
    """What `specrt chat` / `specrt generate` run on a fresh machine: the int4 catalog bundle with the shipped
    EAGLE-3 head and DFlash drafter (int4 too), drafter auto -> both mixed with ngram. With --batch-invariant greedy
    output equals plain decoding in the same mode, through the CLI."""
    from specrt.bundle import load_bundle

    assert load_bundle(int4_bundle).drafter("eagle3").raw["graph"]["precision"] == "int4"

    def generate(*extra):
        proc = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", str(int4_bundle), "--prompt",
                               PROMPTS[1], "--max-new-tokens", "64", "--json", "--device", "cpu", *extra],
                              capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    exact, plain = generate("--batch-invariant"), generate("--drafter", "none", "--batch-invariant")
    assert exact["stats"]["drafter"] == "eagle3+dflash+ngram+ngram:pool" and plain["stats"]["drafter"] == "none"
    assert exact["token_ids"] == plain["token_ids"]
