"""Int4 block quantization: error bound, layout against ONNX Runtime's MatMulNBits."""

from __future__ import annotations

import numpy as np
import pytest
import onnxruntime as ort
from onnx import TensorProto

from specrt.convert.onnx_graph import MS_DOMAIN, GraphWriter
from specrt.convert.quantize import concat_rows, dequantize_int4, quantize_int4


def test_quantization_error_within_half_a_step():
    w = np.random.default_rng(0).standard_normal((24, 100)).astype(np.float32)  # K not a block multiple
    q = quantize_int4(w, search=False)
    err = np.abs(dequantize_int4(q) - w)
    blocks = np.pad(w, ((0, 0), (0, 28))).reshape(24, 4, 32)
    step = (np.maximum(blocks.max(-1), 0) - np.minimum(blocks.min(-1), 0)) / 15
    assert err.reshape(24, -1).max() <= step.max() / 2 + 1e-6
    searched = quantize_int4(w, search=True)
    assert np.square(dequantize_int4(searched) - w).sum() <= np.square(dequantize_int4(q) - w).sum()


def test_layout_matches_matmulnbits():
    rng = np.random.default_rng(1)
    n, k = 40, 96
    parts = [quantize_int4(rng.standard_normal((n // 2, k)).astype(np.float32) + 0.3) for _ in range(2)]
    q = concat_rows(parts)
    g = GraphWriter("t")
    g.add_input("x", TensorProto.FLOAT, [3, k])
    g.op("MatMulNBits", ["x", g.weight("b", q.packed), g.weight("s", q.scales), g.weight("z", q.zero_points)],
         outputs=["y"], domain=MS_DOMAIN, K=k, N=n, bits=4, block_size=32, accuracy_level=0)
    g.add_output("y", TensorProto.FLOAT, [3, n])
    sess = ort.InferenceSession(g.model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((3, k)).astype(np.float32)
    ref = x @ np.concatenate([dequantize_int4(p) for p in parts]).T
    assert np.abs(sess.run(None, {"x": x})[0] - ref).max() <= 1e-4


def test_row_chunks_quantize_exactly_like_the_whole_matrix(monkeypatch):
    """Blocks lie within rows, so quantizing 2048-row chunks (bounded memory for a 150k-row lm_head) gives
    the same bytes as the whole matrix at once."""
    import specrt.convert.quantize as q

    w = np.random.default_rng(3).normal(size=(70, 96)).astype(np.float32)
    whole = quantize_int4(w)
    monkeypatch.setattr(q, "ROW_CHUNK", 16)
    chunked = quantize_int4(w)
    assert np.array_equal(chunked.packed, whole.packed)
    assert np.array_equal(chunked.scales, whole.scales)
    assert np.array_equal(chunked.zero_points, whole.zero_points)
    assert (chunked.n, chunked.k) == (70, 96)


@pytest.mark.parametrize("block", [32, 64, 128])
def test_rows_padded_as_batch_invariant_mode_does_agree_bit_for_bit(block):
    """What exact int4 speculation relies on: MatMulNBits (int8 activations) gives a row the same bits in every
    call that batch-invariant mode can make (TargetSession.padded_rows: >= 2 rows, and an even count for blocks
    above 32), whatever the number of tokens behind it."""
    from specrt.runtime.target_session import TargetSession

    rng = np.random.default_rng(5)
    n, k = 256, 1536
    q = quantize_int4(rng.standard_normal((n, k)).astype(np.float32), block)
    g = GraphWriter("t")
    g.add_input("x", TensorProto.FLOAT, ["m", k])
    g.op("MatMulNBits", ["x", g.weight("b", q.packed), g.weight("s", q.scales), g.weight("z", q.zero_points)],
         outputs=["y"], domain=MS_DOMAIN, K=k, N=n, bits=4, block_size=block, accuracy_level=4)
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
