"""int8 bundles: 8-bit block weights (MatMulNBits bits=8, int8 activations, as int4 runs them), the CPU's fast path
closest to fp32.

Default tier, a tiny model: conversion writes 8-bit weights and records the precision; a self-int4 draft model
drafts beside the int8 target; greedy speculation (batch-invariant by default, as for int4) equals plain decoding.
Full tier, the real model: the int8 conversion with every drafter the catalog has; each equals plain decoding,
and greedy int8 output follows fp32's further than int4's does."""

from __future__ import annotations

import onnx
import pytest

import specrt
from specrt.runtime.sampling import SamplingParams
from tests.conftest import DFLASH_HEAD, EAGLE3_HEAD, _convert
from tests.lossless import PROMPTS, assert_both_paths, compare_with_plain

PARAMS = SamplingParams(max_new_tokens=40, stop_token_ids=())
TINY_PROMPTS = ("the cat and the dog", "a man in the house of the world", "the world the world the world")


def _bits(graph_file) -> set[int]:
    graph = onnx.load(str(graph_file), load_external_data=False)
    return {a.i for n in graph.graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")
            for a in n.attribute if a.name == "bits"}


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory):
    from tests.tiny_models import convert_tiny_llama

    return convert_tiny_llama(tmp_path_factory.mktemp("int8"), "int8", 4, "--precision", "int8",
                              "--drafter", "draft-model:self-int4")


def test_int8_conversion_writes_8_bit_weights(tiny_int8):
    from specrt.bundle import load_bundle

    manifest = load_bundle(tiny_int8)
    assert manifest.target.precision == "int8" and manifest.target.int4_block_size == 32
    assert _bits(tiny_int8 / manifest.target.file) == {8}
    assert _bits(tiny_int8 / manifest.drafter("draft-model").raw["graph"]["file"]) == {4}  # self-int4 beside it
    validation = manifest.provenance["validation"]
    assert validation["quantized_reference"]["top1_agreement"] == 1.0  # float activations, same int8 weights


@pytest.mark.parametrize("drafter", ["ngram", "draft-model", "draft-model+ngram"])
def test_int8_greedy_speculation_equals_plain(tiny_int8, drafter):
    engine = specrt.load(str(tiny_int8), device="cpu", drafter=drafter, batch_invariant=True)
    # int8 activations: exact speculation asks for batch-invariant calls, which on this graph pad only the attention
    assert engine.rows_invariant and engine.target.min_rows == 1 and engine.target.attention_min_rows == 2
    for prompt in TINY_PROMPTS:
        plain = engine.generate(prompt, PARAMS, drafter=None).wait()
        engine.reset()
        spec = engine.generate(prompt, PARAMS).wait()
        engine.reset()
        assert spec.token_ids == plain.token_ids, (drafter, prompt)


@pytest.fixture(scope="module")
def int8_bundle(real_root):
    return _convert(real_root, "int8", "--precision", "int8", "--drafter", f"eagle3:{EAGLE3_HEAD}",
                    "--drafter", f"dflash:{DFLASH_HEAD}", "--drafter", "draft-model:self-int4")


@pytest.mark.real_model
@pytest.mark.full
@pytest.mark.parametrize("drafter", ["ngram", "eagle3", "dflash", "draft-model", "draft-model+ngram"])
def test_real_int8_speculation_equals_plain(int8_bundle, drafter):
    from specrt.app.api import make_drafter

    engine = specrt.load(str(int8_bundle), device="cpu", drafter=drafter, batch_invariant=True)
    assert engine.rows_invariant and engine.target.min_rows == 1
    # every call drafting: left to the adaptive controller a drafter drafts as this machine's timings say (eagle3
    # drafted 7 tokens in a whole run once batch-invariant calls got cheaper), and timing must not decide a test
    engine.adaptive = False
    model = make_drafter(drafter, engine.bundle_dir, engine.manifest, engine.providers)
    assert_both_paths(compare_with_plain(engine, lambda prompt, plain: model))


@pytest.mark.real_model
@pytest.mark.full
def test_real_int8_follows_fp32_further_than_int4(int8_bundle, bundles):
    """Greedy plain decoding, 10 prompts x 64 tokens: the tokens int8 (and int4) produce before they first leave
    fp32's output. int8's weights are 16x finer than int4's, so it must follow fp32 further on average."""
    params = SamplingParams(max_new_tokens=64, stop_token_ids=())

    def outputs(bundle):
        engine = specrt.load(str(bundle), device="cpu", drafter=None)
        return [engine.generate(p, params).wait().token_ids for p in PROMPTS]

    def common(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    fp32, int8, int4 = outputs(bundles["fp32"]), outputs(int8_bundle), outputs(bundles["int4"])
    int8_prefix = sum(common(a, b) for a, b in zip(fp32, int8)) / len(PROMPTS)
    int4_prefix = sum(common(a, b) for a, b in zip(fp32, int4)) / len(PROMPTS)
    print(f"\ntokens equal to fp32's before the first difference: int8 {int8_prefix:.1f}, int4 {int4_prefix:.1f}")
    assert int8_prefix > int4_prefix
