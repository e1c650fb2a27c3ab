"""The second architecture on a real file: Gemma 3 270M (Q4_K_M GGUF from PyPI) converts, and its logits
equal transformers' own GGUF loader on the same file."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.full]


def test_gemma3_270m_matches_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    import specrt
    from specrt.catalog import fetch
    from specrt.cli import main

    # fp32: the GGUF's exact dequantization, which transformers' loader computes too
    assert main(["convert", "gemma3-270m", "-o", str(tmp_path / "g"), "--max-context", "256", "--precision",
                 "fp32"]) == 0
    engine = specrt.load(str(tmp_path / "g"), device="cpu")
    assert engine.manifest.architecture == "gemma3_text"
    assert "sliding_attention_bias" in engine.manifest.target.inputs
    gguf = fetch("gemma3-270m")
    ref_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    for prompt in ("The capital of France is", "def add(a, b):\n    return"):
        ids = [engine.manifest.bos_token_id] + engine.prompt_ids(prompt, raw=True)
        with torch.no_grad():
            ref = ref_model(torch.tensor([ids])).logits[0].numpy()
        engine.reset()
        got = engine.feed(ids)
        assert np.abs(got - ref).max() <= 1e-3
        assert (got.argmax(-1) == ref.argmax(-1)).all()
