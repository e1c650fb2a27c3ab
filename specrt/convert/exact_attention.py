"""Attention whose result for a token does not depend on the call it is in: what batch-invariant mode runs.

GroupQueryAttention (CPU) multiplies queries by keys with one GEMM of N = the call's key count and K = the head size,
and MLAS chooses how to split K into blocks by N (sgemm.cpp: "expand the K stride if N is small"): a token whose
one-token call has 60 keys and whose verification call has 66 sums its q.k in one block of 256 in the first and in
two blocks of 128 in the second, and rounds apart (scripts/gqa_call_invariance_probe.py: head size 256 near 64 and
192 keys, 512 near 96, 160, 224, 288; head size 128 nowhere). Under int8 activations such a difference can change a
token.

This path computes the same attention from GroupQueryAttention's present cache (the op still writes the cache in
place and rotates the keys) with GEMMs whose blocking no call can change:

    scores [T, S] = keys [T, D] x q^T [D, S]   N = S (a call's queries, <= 16): one K block of D for any T
    weights = exp(scores + bias - max)         elementwise; the max is exact in any order
    sum [2, S] = ones [2, T] x weights          K = T in blocks at fixed multiples; masked keys add exact zeros
    out [S, D] = weights^T [S, T] x V [T, D]   the same; each row divided by its sum

(M >= 2 everywhere: the one-row GEMM kernels sum differently; a call's queries are at least two rows already in
batch-invariant mode, convert/attention_rows.py.) Queries are rotated here with RotaryEmbedding over the same
cos/sin caches. The graph runs this branch only when attention_min_rows > 1 (an If per layer); the default mode keeps
GroupQueryAttention's own output. Only layers whose head size is above 128 get it (needs_exact_attention): at 128
or less GroupQueryAttention is one K block in every call already. Cost in batch-invariant mode, where it is built:
the attention twice, plus copies of the keys and values in use, 1.1-1.7x a plain call at gemma3-270m
(docs/performance.md, "Losslessness and batch-invariant calls").
"""

from __future__ import annotations

from onnx import TensorProto, helper

from specrt.convert.onnx_graph import MS_DOMAIN, captured

# MLAS splits a GEMM's K into blocks of 128 (expanding the block when N is small): a head size of 128 or less is one
# block in every call, so GroupQueryAttention is call-invariant there and needs no exact path (the probe finds none
# at 64 and 128; docs/performance.md, "Losslessness and batch-invariant calls": the path made batch-invariant calls
# 1.3-2.4x slower at head size 64 for nothing)
ONE_BLOCK_HEAD = 128


def needs_exact_attention(head_dim: int) -> bool:
    """Whether a layer of this head size gets the exact path (head sizes GroupQueryAttention splits by call)."""
    return head_dim > ONE_BLOCK_HEAD


def exact_attention_switch(b, exact: str, gqa_out: str, q: str, present: list[str], positions: str, bias: str,
                           total_len: str, layer: int, sinks: str | None) -> str:
    """If(exact) the call-invariant attention, else GroupQueryAttention's output gqa_out [B, S', N * D]."""
    g, name = b.g, f"layers.{layer}.exact_attn"
    then_nodes: list = []
    with captured(g, then_nodes):
        y = exact_attention(b, q, present, positions, bias, total_len, layer, sinks)
    else_nodes: list = []
    with captured(g, else_nodes):
        y_else = g.op("Identity", [gqa_out])
    return g.op("If", [exact], name=name,
                then_branch=helper.make_graph(then_nodes, name + ".then", [],
                                              [helper.make_tensor_value_info(y, b.elem, None)]),
                else_branch=helper.make_graph(else_nodes, name + ".else", [],
                                              [helper.make_tensor_value_info(y_else, b.elem, None)]))


def exact_attention(b, q: str, present: list[str], positions: str, bias: str, total_len: str, layer: int,
                    sinks: str | None) -> str:
    """q [B, S, N * D] before rotary (or the packed q|k|v), present key/value [B, KV, M, D] (this call's keys
    written), positions [B, S], bias [B, 1, S, T], total_len [1] int32 (T) -> attention output [B, S, N * D]."""
    g, cfg = b.g, b.cfg
    n, kv, d = cfg.num_heads, cfg.kv_heads_of(layer), cfg.head_dim_of(layer)
    group = n // kv
    q = g.op("Slice", [q, g.const([0]), g.const([n * d]), g.const([2])])  # the packed q|k|v form: queries first
    cos, sin = b.rope_cache(layer)  # [M, R/2]: the first R channels of each head turn (partial rotary)
    q = g.op("RotaryEmbedding", [q, positions, cos, sin], domain=MS_DOMAIN, interleaved=0, num_heads=n,
             rotary_embedding_dim=2 * len(cfg.rope_for(layer).inv_freq(cfg.rotary_dim_of(layer))))
    q = g.op("Mul", [q, g.const(cfg.scale_of(layer), dtype=b.dtype)])
    qt = g.op("Transpose", [g.op("Reshape", [q, g.const([0, 0, kv, group, d])])], perm=[0, 2, 3, 4, 1])  # [B,KV,G,D,S]
    t = g.op("Cast", [total_len], to=TensorProto.INT64)  # [1]: T
    keys, values = (g.op("Unsqueeze", [g.op("Slice", [x, g.const([0]), t, g.const([2])]), g.const([2])])
                    for x in present)  # [B, KV, 1, T, D]
    scores = g.op("MatMul", [keys, qt])  # [B, KV, G, T, S]
    scores = g.op("Add", [scores, g.op("Unsqueeze", [g.op("Transpose", [bias], perm=[0, 1, 3, 2]), g.const([2])])])
    # causal, as GroupQueryAttention masks: row r of S sees keys j <= T - S + r (the bias holds only tree/window masks)
    s = g.op("Gather", [g.op("Shape", [q]), g.const([1])], axis=0)  # [1]: S
    key_ids = g.op("Unsqueeze", [g.op("Range", [g.const(0), g.op("Squeeze", [t]), g.const(1)]), g.const([1])])  # [T,1]
    last = g.op("Add", [g.op("Range", [g.const(0), g.op("Squeeze", [s]), g.const(1)]), g.op("Sub", [t, s])])  # [S]
    hidden = g.op("Greater", [key_ids, last])  # [T, S]
    scores = g.op("Where", [hidden, g.const(float("-inf"), dtype=b.dtype), scores])
    top = g.op("ReduceMax", [scores, g.const([-2])], keepdims=1)  # [B, KV, G, 1, S]
    if sinks is not None:  # gpt-oss: each head's sink logit joins the max and the denominator
        sink = g.op("Reshape", [sinks, g.const([1, kv, group, 1, 1])])
        top = g.op("Max", [top, sink])
    weights = g.op("Exp", [g.op("Sub", [scores, top])])  # [B, KV, G, T, S]; 0 where the bias is -inf
    ones = g.op("ConstantOfShape", [g.op("Concat", [g.const([2]), t], axis=0)],
                value=helper.make_tensor("one", b.elem, [1], [1.0]))  # [2, T]
    total = g.op("Slice", [g.op("MatMul", [ones, weights]), g.const([0]), g.const([1]), g.const([-2])])  # [.,1,S]
    if sinks is not None:
        total = g.op("Add", [total, g.op("Exp", [g.op("Sub", [sink, top])])])
    out = g.op("MatMul", [g.op("Transpose", [weights], perm=[0, 1, 2, 4, 3]), values])  # [B, KV, G, S, D]
    out = g.op("Div", [out, g.op("Transpose", [total], perm=[0, 1, 2, 4, 3])])
    return g.op("Reshape", [g.op("Transpose", [out], perm=[0, 3, 1, 2, 4]), g.const([0, 0, n * d])])
