"""Greedy losslessness of the draft-verify loop on the real model, every drafter on the shared bundles: at fp32 the
n-gram drafter, the draft model (the model's own int4 graph, self-int4), their adaptive mix, the shipped EAGLE-3
head (chain and tree, fixed and adaptive), a drafter that is always right and one that is always wrong; at int4
(batch-invariant calls) the n-gram drafter, the EAGLE-3 head, right and wrong. Each equals plain decoding token for
token (tests/lossless.py: 3 prompts x 48 tokens in the default tier, 10 x 128 in the full tier).

(An int4 graph is not batch-invariant by itself: MatMulNBits with int8 activations rounds differently for one
token than for several, so speculation there runs every call with >= 2 rows; see docs/perf.md.)"""

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
    engine.adaptive = "ngram" in mode  # else a fixed draft length (4): every call drafts
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
    return specrt.load(str(fp32_bundle), device="cpu", drafter="auto")


@pytest.mark.parametrize("mode", ["chain", "chain-adaptive", "tree", "tree-adaptive"])
def test_eagle3_greedy_equals_plain(eagle3_engine, mode):
    engine = eagle3_engine
    assert engine.drafter.name == "eagle3"  # what drafter="auto" picked
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


def test_int4_turns_batch_invariance_on_with_a_drafter(bundles):
    assert specrt.load(str(bundles["int4"]), device="cpu", drafter="ngram").target.min_rows == 2
    assert specrt.load(str(bundles["int4"]), device="cpu", drafter="auto").target.min_rows == 2  # its head
    assert specrt.load(str(bundles["int4"]), device="cpu", drafter=None).target.min_rows == 1  # plain
    assert specrt.load(str(bundles["fp32"]), device="cpu", drafter="ngram").target.min_rows == 1


def test_default_int4_bundle_drafts_with_its_head_by_default(int4_bundle):
    """What `specrt chat` / `specrt generate` run on a fresh machine: the int4 catalog bundle with the shipped
    EAGLE-3 head (int4 too), drafter auto -> eagle3, batch-invariant on; greedy output equals plain decoding
    in the same mode, through the CLI."""
    from specrt.bundle import load_bundle

    assert load_bundle(int4_bundle).drafter("eagle3").raw["graph"]["precision"] == "int4"

    def generate(*extra):
        proc = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", str(int4_bundle), "--prompt",
                               PROMPTS[1], "--max-new-tokens", "64", "--json", "--device", "cpu", *extra],
                              capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    default, plain = generate(), generate("--drafter", "none", "--batch-invariant")
    assert default["stats"]["drafter"] == "eagle3" and plain["stats"]["drafter"] == "none"
    assert default["token_ids"] == plain["token_ids"]
