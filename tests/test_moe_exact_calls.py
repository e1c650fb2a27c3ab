"""Exact calls on a mixture of experts: with experts_token_by_token set, a token's logits do not depend on the other
tokens of its call (bitwise), so batch-invariant greedy speculation on an int4/int8 MoE equals plain decoding token
for token (convert/moe_graph.py). Eight experts a token, as Qwen3-30B-A3B routes: the batched op adds a token's
expert outputs in an order set by the whole call, which is what the exact form removes."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.cli import main
from specrt.runtime.sampling import SamplingParams
from tests.tiny_models import save_tiny_bundle_source

ARCH = "qwen3_moe_top8"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_exact")
    source = save_tiny_bundle_source(ARCH, root / "source")
    out = {}
    for precision in ("int4", "int8"):
        out[precision] = root / precision
        assert main(["convert", str(source), "-o", str(out[precision]), "--precision", precision,
                     "--max-context", "128"]) == 0
    return out


def one_call(target, ids: list[int], split: int, token_by_token: bool) -> np.ndarray:
    """Logits [n - split, V] of ids[split:] fed in one call after ids[:split]."""
    target.reset()
    target.experts_token_by_token = token_by_token
    target.forward(np.array([ids[:split]], np.int64))
    return target.forward(np.array([ids[split:]], np.int64))[0]


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_a_tokens_logits_do_not_depend_on_its_call(bundles, precision):
    import specrt

    engine = specrt.load(str(bundles[precision]), device="cpu", batch_invariant=True)  # attention on >= 2 rows
    assert engine.target.has_expert_calls and engine.target.attention_min_rows == 2
    ids = list(np.random.default_rng(1).integers(3, 97, size=24))
    target = engine.target
    # one token a call: what plain decoding computes (each expert sees one row whichever mode)
    target.reset()
    target.forward(np.array([ids[:12]], np.int64))
    alone = np.concatenate([target.forward(np.array([[t]], np.int64))[0] for t in ids[12:]])
    exact = one_call(target, ids, 12, token_by_token=True)
    assert np.array_equal(exact, alone)
    batched = one_call(target, ids, 12, token_by_token=False)
    assert np.abs(batched - alone).max() < 1e-3  # the batched op agrees closely, without the guarantee


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_batch_invariant_speculation_on_a_top8_moe_equals_plain(bundles, precision):
    import specrt

    engine = specrt.load(str(bundles[precision]), device="cpu", drafter="ngram", batch_invariant=True)
    assert engine.target.experts_token_by_token
    params = SamplingParams(max_new_tokens=48, stop_token_ids=())
    engine.max_draft, engine.adaptive = 4, False
    for prompt in ("the cat and the dog and the cat and the dog", "a man in the house of the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        spec = engine.generate(prompt, params).wait()
        assert spec.token_ids == plain.token_ids
        assert spec.stats.target_calls < plain.stats.target_calls  # drafts were verified in multi-token calls
