"""scripts/synthetic_kquants.py: llama.cpp's Q4_K_M type mix and the random blocks that fill a synthetic real-size
GGUF (scripts/synthetic_gguf.py --quant q4_k_m), read back by gguf-py and converted by specrt."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import synthetic_kquants  # noqa: E402
from synthetic_kquants import Q4KMix, random_blocks  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))


def test_the_mix_follows_llama_cpps_q4_k_m_rules():
    names = ["token_embd.weight", "output.weight"] + [f"blk.{i}.{k}.weight" for i in range(32)
                                                      for k in ("attn_q", "attn_v", "ffn_down", "ffn_up")]
    mix = Q4KMix(names, 32)
    # use_more_bits over 32 layers, written out: the first and last eighth, and every third layer between
    more = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
    for i in range(32):
        want = "Q6_K" if i in more else "Q4_K"
        assert mix(f"blk.{i}.attn_v.weight", (1024, 4096)) == want
        assert mix(f"blk.{i}.ffn_down.weight", (4096, 14336)) == want
        assert mix(f"blk.{i}.attn_q.weight", (4096, 4096)) == "Q4_K"
    assert mix("output.weight", (128256, 4096)) == "Q6_K" and mix("token_embd.weight", (128256, 4096)) == "Q4_K"
    tied = Q4KMix([n for n in names if n != "output.weight"], 32)  # tied embeddings: the embedding is the head
    assert tied("token_embd.weight", (128256, 2048)) == "Q6_K"
    assert mix("blk.0.ffn_gate_inp.weight", (128, 2048)) == "F32"  # the router is never quantized
    assert mix("blk.0.attn_norm.weight", (4096,)) == "F32"
    assert mix("blk.5.attn_qkv.weight", (8192, 4096)) == "Q5_K"  # a fused q/k/v (Qwen3.5's linear attention)
    # rows not a multiple of 256: Q4_K's fallback Q5_0, Q5_K's Q5_1, Q6_K's Q8_0
    assert mix("blk.0.ffn_up.weight", (896, 300)) == "Q5_0" and mix("output.weight", (10, 300)) == "Q8_0"
    assert mix("blk.5.attn_qkv.weight", (8192, 300)) == "Q5_1"


@pytest.mark.parametrize("qtype", sorted(synthetic_kquants.LAYOUT))
def test_random_blocks_read_back_as_weights_of_a_trained_scale(qtype):
    import gguf

    data = random_blocks("blk.0.ffn_up.weight", (64, 512), qtype, seed=0)
    w = gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, qtype))  # gguf-py's own reading
    assert w.shape == (64, 512) and np.isfinite(w).all()
    assert 0.015 < w.std() < 0.03 and abs(w.mean()) < 0.003
    assert np.array_equal(data, random_blocks("blk.0.ffn_up.weight", (64, 512), qtype, seed=0))  # seeded
    assert not np.array_equal(data, random_blocks("blk.1.ffn_up.weight", (64, 512), qtype, seed=0))


def test_a_q4_k_m_synthetic_gguf_converts_exactly(tmp_path):
    """The test-size twin of the Llama-3.1-8B layout as Q4_K_M: every K-quant kind and both fallbacks (its MLP's
    896 rows are not a multiple of 256), converted by specrt on the file's own blocks, its exact check passed."""
    import gguf

    from specrt.cli import main as specrt_main

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import synthetic_gguf
        import synthetic_model
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    synthetic_model.main(["llama-3.1-8b", str(tmp_path / "src"), "--tiny", "--layers", "2"])
    out = tmp_path / "tiny.q4_k_m.gguf"
    synthetic_gguf.main(str(tmp_path / "src" / "target"), str(out), quant="q4_k_m")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types["output.weight"] == "Q6_K" and types["blk.0.attn_q.weight"] == "Q4_K"
    assert types["blk.1.attn_v.weight"] == "Q6_K" and types["blk.0.attn_v.weight"] == "Q4_K"
    assert types["blk.0.ffn_down.weight"] == "Q5_0" and types["blk.1.ffn_down.weight"] == "Q8_0"
    assert specrt_main(["convert", str(out), "-o", str(tmp_path / "bundle"), "--max-context", "128"]) == 0
    manifest = json.loads((tmp_path / "bundle" / "specrt.json").read_text())
    assert manifest["target"]["precision"] == "gguf"
