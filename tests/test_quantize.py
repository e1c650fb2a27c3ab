"""Int4 and int8 block quantization: error bound, layout against ONNX Runtime's MatMulNBits and
GatherBlockQuantized."""

from __future__ import annotations

import numpy as np
import pytest
import onnxruntime as ort
from onnx import TensorProto

from specrt.convert.onnx_graph import MS_DOMAIN, GraphWriter
from specrt.convert.quantize import concat_rows, dequantize, quantize_blocks


@pytest.mark.parametrize("bits", [4, 8])
def test_quantization_error_within_half_a_step(bits):
    w = np.random.default_rng(0).standard_normal((24, 100)).astype(np.float32)  # K not a block multiple
    q = quantize_blocks(w, search=False, bits=bits)
    err = np.abs(dequantize(q) - w)
    blocks = np.pad(w, ((0, 0), (0, 28))).reshape(24, 4, 32)
    step = (np.maximum(blocks.max(-1), 0) - np.minimum(blocks.min(-1), 0)) / (2 ** bits - 1)
    assert err.reshape(24, -1).max() <= step.max() / 2 + 1e-6
    searched = quantize_blocks(w, search=True, bits=bits)
    assert np.square(dequantize(searched) - w).sum() <= np.square(dequantize(q) - w).sum()


@pytest.mark.parametrize("bits", [4, 8])
def test_layout_matches_matmulnbits(bits):
    rng = np.random.default_rng(1)
    n, k = 40, 96
    parts = [quantize_blocks(rng.standard_normal((n // 2, k)).astype(np.float32) + 0.3, bits=bits) for _ in range(2)]
    q = concat_rows(parts)
    g = GraphWriter("t")
    g.add_input("x", TensorProto.FLOAT, [3, k])
    g.op("MatMulNBits", ["x", g.weight("b", q.packed), g.weight("s", q.scales), g.weight("z", q.zero_points)],
         outputs=["y"], domain=MS_DOMAIN, K=k, N=n, bits=bits, block_size=32, accuracy_level=0)
    g.add_output("y", TensorProto.FLOAT, [3, n])
    sess = ort.InferenceSession(g.model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((3, k)).astype(np.float32)
    ref = x @ np.concatenate([dequantize(p) for p in parts]).T
    assert np.abs(sess.run(None, {"x": x})[0] - ref).max() <= 1e-4


@pytest.mark.parametrize("bits", [4, 8])
def test_layout_matches_gather_block_quantized(bits):
    """The embedding table's layout: GatherBlockQuantized over the same blocks returns the dequantized rows."""
    rng = np.random.default_rng(2)
    n, k = 50, 64
    q = quantize_blocks(rng.standard_normal((n, k)).astype(np.float32), bits=bits)
    g = GraphWriter("t")
    g.add_input("ids", TensorProto.INT64, [4])
    g.op("GatherBlockQuantized", [g.weight("b", q.packed.reshape(n, -1)), "ids", g.weight("s", q.scales.reshape(n, -1)),
                                  g.weight("z", q.zero_points.reshape(n, -1))],
         outputs=["y"], domain=MS_DOMAIN, gather_axis=0, quantize_axis=1, block_size=32, bits=bits)
    g.add_output("y", TensorProto.FLOAT, [4, k])
    sess = ort.InferenceSession(g.model().SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([0, 7, 49, 7])
    assert np.abs(sess.run(None, {"ids": ids})[0] - dequantize(q)[ids]).max() <= 1e-6


def test_row_chunks_quantize_exactly_like_the_whole_matrix(monkeypatch):
    """Blocks lie within rows, so quantizing 2048-row chunks (bounded memory for a 150k-row lm_head) gives
    the same bytes as the whole matrix at once."""
    import specrt.convert.quantize as q

    w = np.random.default_rng(3).normal(size=(70, 96)).astype(np.float32)
    whole = quantize_blocks(w)
    monkeypatch.setattr(q, "ROW_CHUNK", 16)
    chunked = quantize_blocks(w)
    assert np.array_equal(chunked.packed, whole.packed)
    assert np.array_equal(chunked.scales, whole.scales)
    assert np.array_equal(chunked.zero_points, whole.zero_points)
    assert (chunked.n, chunked.k) == (70, 96)


@pytest.mark.parametrize("block,bits", [(32, 4), (64, 4), (128, 4), (32, 8), (64, 8), (128, 8)])
def test_rows_padded_as_batch_invariant_mode_does_agree_bit_for_bit(block, bits):
    """What exact int4/int8 speculation relies on: MatMulNBits (int8 activations) gives a row the same bits in every
    call that batch-invariant mode can make (TargetSession.padded_rows: >= 2 rows, and an even count for blocks
    above 32), whatever the number of tokens behind it."""
    from specrt.runtime.target_session import TargetSession

    rng = np.random.default_rng(5)
    n, k = 256, 1536
    q = quantize_blocks(rng.standard_normal((n, k)).astype(np.float32), block, bits=bits)
    g = GraphWriter("t")
    g.add_input("x", TensorProto.FLOAT, ["m", k])
    g.op("MatMulNBits", ["x", g.weight("b", q.packed), g.weight("s", q.scales), g.weight("z", q.zero_points)],
         outputs=["y"], domain=MS_DOMAIN, K=k, N=n, bits=bits, block_size=block, accuracy_level=4)
    g.add_output("y", TensorProto.FLOAT, ["m", n])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(g.model().SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((12, k)).astype(np.float32)
    full = sess.run(None, {"x": x})[0]  # 12 rows
    rule = TargetSession.__new__(TargetSession)
    rule.min_rows, rule.even_rows = 2, block > 32
    for tokens in range(1, 12):
        rows = rule.padded_rows(tokens)
        assert np.array_equal(sess.run(None, {"x": x[:rows]})[0][:tokens], full[:tokens]), (block, tokens, rows)
