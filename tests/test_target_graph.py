"""The ONNX target graph (fused ORT ops, in-place KV cache) against the torch reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import torch

from specrt.convert.quantize import dequantize
from specrt.convert.target_graph import GraphOptions, build_target_graph, quantize_model
from specrt.models.config import config_from_hf
from specrt.models.transformer import CausalLM
from specrt.runtime.target_session import ContextOverflowError, TargetSession, TargetSpec
from tests.tiny_models import ARCHS, hf_model

MAX_CONTEXT = 64


def setup(arch, tmp_path, precision="fp32", hidden_layers=(), **graph_kwargs):
    hf = hf_model(arch)
    cfg = config_from_hf(hf.config.to_dict())
    weights = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    opts = GraphOptions(precision=precision, max_context=MAX_CONTEXT, hidden_layers=hidden_layers, **graph_kwargs)
    bits = {"int4": 4, "int8": 8}.get(precision)
    quantized = quantize_model(cfg, weights, bits=bits) if bits else None
    onnx.save_model(build_target_graph(cfg, weights, opts, quantized), str(tmp_path / "t.onnx"))
    ref_cfg, ref_weights = cfg, weights
    if quantized:
        ref_weights = dict(weights, **{n: dequantize(q) for n, q in quantized.items()})
        ref_cfg = dataclasses.replace(cfg, tie_word_embeddings=False)
    ref = CausalLM(ref_cfg).eval()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in ref_weights.items()}, strict=False)
    spec = TargetSpec(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, MAX_CONTEXT, cfg.vocab_size,
                      hidden_output=bool(hidden_layers), sliding_window=cfg.active_sliding_window)
    return cfg, ref, TargetSession(tmp_path / "t.onnx", spec)


@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_equals_torch_with_multistep_kv(arch, tmp_path):
    cfg, ref, sess = setup(arch, tmp_path, hidden_layers=(0, 1))
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, (1, 14))
    with torch.no_grad():
        full, _, taps = ref(torch.from_numpy(ids), hidden_layers=(0, 1))
    outs = [sess.forward(ids[:, lo:hi]) for lo, hi in ((0, 6), (6, 7), (7, 8), (8, 14))]
    logits = np.concatenate([o[0] for o in outs], axis=1)
    hidden = np.concatenate([o[1] for o in outs], axis=1)
    assert np.abs(logits - full.numpy()).max() <= 1e-4
    assert np.abs(hidden - taps.numpy()).max() <= 1e-4
    assert sess.length == 14


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rollback_then_redecode_reuses_slots(arch, tmp_path):
    cfg, ref, sess = setup(arch, tmp_path)
    ids = np.random.default_rng(4).integers(0, cfg.vocab_size, (1, 10))
    sess.forward(ids[:, :6])
    sess.forward(np.array([[1, 2, 3]]))  # a rejected draft
    sess.rollback(6)
    got = sess.forward(ids[:, 6:])
    with torch.no_grad():
        full, _, _ = ref(torch.from_numpy(ids))
    assert np.abs(got - full[:, 6:].numpy()).max() <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_tree_mask_equals_separate_chains(arch, tmp_path):
    """Draft tree a -> {b, c} verified in one call equals the chains a,b and a,c."""
    cfg, _, sess = setup(arch, tmp_path)
    prefix = np.array([[5, 17, 23, 42, 8]])
    a, b, c = 7, 11, 13
    sess.forward(prefix)
    p = prefix.shape[1]
    chain_b = sess.forward(np.array([[a, b]]))
    sess.rollback(p)
    chain_c = sess.forward(np.array([[a, c]]))
    sess.rollback(p)
    bias = np.zeros((1, 1, 3, p + 3), dtype=np.float32)
    bias[0, 0, 2, p + 1] = -np.inf
    tree = sess.forward(np.array([[a, b, c]]), position_ids=np.array([[p, p + 1, p + 1]]), attention_bias=bias)
    assert np.abs(tree[0, 0] - chain_b[0, 0]).max() <= 1e-4
    assert np.abs(tree[0, 1] - chain_b[0, 1]).max() <= 1e-4
    assert np.abs(tree[0, 2] - chain_c[0, 1]).max() <= 1e-4


@pytest.mark.parametrize("arch,precision", [("llama", "int4"), ("qwen2", "int4"), ("llama", "int8")])
def test_quantized_graph_equals_torch_on_the_same_quantized_weights(arch, precision, tmp_path):
    # accuracy level 0 keeps activations in fp32, so only the weights are quantized
    cfg, ref, sess = setup(arch, tmp_path, precision=precision, int4_accuracy_level=0)
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, (1, 9))
    got = np.concatenate([sess.forward(ids[:, :5]), sess.forward(ids[:, 5:])], axis=1)
    with torch.no_grad():
        full, _, _ = ref(torch.from_numpy(ids))
    assert np.abs(got - full.numpy()).max() <= 1e-3
    graph = onnx.load(str(tmp_path / "t.onnx"))
    matmuls = [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
    assert len(matmuls) == 4 * cfg.num_layers + 1  # qkv, o, gate_up, down per layer; lm_head
    bits = [a.i for n in graph.graph.node for a in n.attribute if a.name == "bits"]
    assert set(bits) == {8 if precision == "int8" else 4}
    # the embedding table is quantized too (the reference above looks tokens up in the same quantized rows)
    assert [n.op_type for n in graph.graph.node].count("GatherBlockQuantized") == 1
    assert "model.embed_tokens.weight" not in {t.name for t in graph.graph.initializer}


def test_int4_embedding_stays_float_where_its_width_is_not_whole_blocks():
    hf = hf_model("llama")
    cfg = config_from_hf(hf.config.to_dict())
    weights = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    block = 2 * cfg.hidden_size  # wider than a row: the table cannot be blocked row by row
    graph = build_target_graph(cfg, weights, GraphOptions(precision="int4", max_context=MAX_CONTEXT,
                                                          int4_block_size=block))
    ops = [n.op_type for n in graph.graph.node]
    assert "GatherBlockQuantized" not in ops and "Gather" in ops
    assert "model.embed_tokens.weight" in {t.name for t in graph.graph.initializer}


def test_fused_operators_in_graph(tmp_path):
    setup("llama", tmp_path)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "t.onnx")).graph.node}
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"} <= ops
    assert "Softmax" not in ops  # attention is fused, not spelled out


def test_context_overflow_is_a_clear_error(tmp_path):
    cfg, _, sess = setup("llama", tmp_path)
    sess.forward(np.zeros((1, MAX_CONTEXT - 2), dtype=np.int64))
    with pytest.raises(ContextOverflowError, match="max context"):
        sess.forward(np.zeros((1, 3), dtype=np.int64))
