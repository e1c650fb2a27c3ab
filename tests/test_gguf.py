"""GGUF loading: llama.cpp's layout undone (names, q/k permutation) and quantized types expanded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specrt.errors import SourceError
from specrt.models.config import config_from_hf
from specrt.models.gguf_loader import load_gguf
from specrt.models.transformer import CausalLM
from tests.gguf_writer import write_gguf
from tests.test_gguf_exact import random_blocks
from tests.tiny_models import hf_model


def f32(name, w):
    return w, None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f32_gguf_gives_the_same_model(arch, tmp_path):
    hf = hf_model(arch)
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    path = tmp_path / "m.gguf"
    write_gguf(path, arch, hf.config, weights, f32)
    hf_cfg, loaded, _ = load_gguf(path)
    cfg = config_from_hf(hf_cfg)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (3, 4, 2)
    assert cfg.tie_word_embeddings == bool(hf.config.tie_word_embeddings)
    for name, w in weights.items():
        np.testing.assert_array_equal(loaded[name], w)  # permutation undone exactly
    ours = CausalLM(cfg).eval()
    ours.load_state_dict({k: torch.tensor(v) for k, v in loaded.items()}, strict=False)
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids)[0] - hf(ids).logits).abs().max().item() <= 1e-4


def test_quantized_types_load_to_their_dequantized_values(tmp_path):
    """One tensor per storage type: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 (quantized by the gguf package)
    and Q4_K, Q5_K, Q6_K (raw blocks); each loads to what the type encodes."""
    import gguf
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False)
    hf = tf.LlamaForCausalLM(config).eval()
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    types = {
        "model.embed_tokens.weight": "F16", "lm_head.weight": "BF16",
        "model.layers.0.self_attn.q_proj.weight": "Q8_0", "model.layers.0.self_attn.k_proj.weight": "Q4_0",
        "model.layers.0.self_attn.v_proj.weight": "Q4_1", "model.layers.0.self_attn.o_proj.weight": "Q5_0",
        "model.layers.0.mlp.gate_proj.weight": "Q4_K", "model.layers.0.mlp.up_proj.weight": "Q5_K",
        "model.layers.0.mlp.down_proj.weight": "Q6_K",
    }
    rng = np.random.default_rng(0)
    expected = {}

    def encode(name, w):
        t = types.get(name)
        if t is None:
            expected[name] = w
            return w, None
        qtype = gguf.GGMLQuantizationType[t]
        if t == "F16":
            data = w.astype(np.float16)
            expected[name] = data.astype(np.float32)
            return data, None
        data = random_blocks(t, *w.shape, rng) if t.endswith("_K") else gguf.quants.quantize(w, qtype)
        expected[name] = gguf.quants.dequantize(data, qtype).reshape(w.shape)
        if not t.endswith("_K"):  # quantization keeps values near the originals
            tol = {"BF16": 1e-2, "Q8_0": 1e-2, "Q4_0": 0.2, "Q4_1": 0.2, "Q5_0": 0.1}[t] * np.abs(w).max()
            assert np.abs(expected[name] - w).max() <= tol
        return data, qtype

    path = tmp_path / "q.gguf"
    write_gguf(path, "llama", config, weights, encode)
    _, loaded, reader = load_gguf(path)
    assert {t.tensor_type.name for t in reader.tensors} >= set(types.values())
    from specrt.models.gguf_loader import unpermute as _unpermute

    for name, want in expected.items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            want = _unpermute(want, 4)
        np.testing.assert_allclose(loaded[name], want, rtol=0, atol=1e-6, err_msg=name)
    assert np.isfinite(loaded["model.layers.0.mlp.up_proj.weight"]).all()


def test_q4_k_block_semantics(tmp_path):
    """Independent check of one K-quant: with unit sub-block scales and zero mins, Q4_K values are d * q."""
    import gguf

    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, 256)
    block = np.zeros(144, np.uint8)
    block[0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)  # d
    block[4:8] = 1  # scales of sub-blocks 0-3 = 1, mins 0
    block[12:16] = 1  # sub-blocks 4-7: low nibble = scale 1, high nibble = min 0
    for chunk in range(4):  # 64 values per chunk: low nibbles first 32, high nibbles next 32
        lo, hi = q[chunk * 64: chunk * 64 + 32], q[chunk * 64 + 32: chunk * 64 + 64]
        block[16 + chunk * 32: 16 + chunk * 32 + 32] = lo | (hi << 4)
    out = gguf.quants.dequantize(block[None], gguf.GGMLQuantizationType.Q4_K).reshape(-1)
    np.testing.assert_allclose(out, 0.5 * q)


def test_corrupt_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(SourceError, match="bad.gguf: declares .* more than its 48 bytes can hold"):
        load_gguf(bad)
    with pytest.raises(SourceError, match="no such file"):
        load_gguf(tmp_path / "missing.gguf")
