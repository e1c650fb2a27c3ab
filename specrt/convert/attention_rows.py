"""At least two rows into every GroupQueryAttention: what makes a one-token call round like a multi-token one.

GroupQueryAttention multiplies the attention weights by V with one GEMM of as many rows as the call has new tokens,
and MLAS runs a one-row GEMM with another kernel (separate multiply and add, no FMA) than a GEMM of several rows.
A one-token decode step therefore computed a token's attention output differently (~3e-8) from the same token inside
a multi-token verification call, and int8 activations (MatMulNBits at accuracy level 4) grew that into different
logits. Everything else in the graph rounds a row the same way at any row count (MatMulNBits at blocks of 32 too;
tests/test_quantize.py).

The fix, inside the graph: the input `attention_min_rows` (m) makes a call of S tokens feed its attentions
S' = max(S, m) rows, the S real ones and, for a one-token call at m = 2, a copy of that token at the next position.
The pad row writes its key and value one cache slot past the real tokens (where the next call writes its own: the
runtime allocates that one spare slot) and its output is sliced away; being last, no real row sees it (attention
is causal within a call). Only attention pays for the extra row, but attention grows with the context, and at
m > 1 CPU graphs also switch each attention to a form whose rounding no call's key count changes
(convert/exact_attention.py): measured at int4 on the default model, a one-token call then takes 11.84 ms instead
of 8.52 at 64 tokens of context and 35.13 ms instead of 14.38 at 1024 (docs/performance.md, "Losslessness and
batch-invariant calls"), so the runtime asks for it only where it wants exact calls (batch-invariant mode) and
feeds m = 1 otherwise. Calls of two or more tokens get no pad row, and every call at m = 1 is unchanged (the
gathers are identities).
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import TensorProto

from specrt.bundle import ATTENTION_ROWS_INPUT
from specrt.convert.onnx_graph import GraphWriter


@dataclass(frozen=True)
class AttentionRows:
    """Names of the padded attention inputs, and the nodes that pad and cut a row dimension."""

    rows: str  # [S'] int64: the source row of each attention row (0..S-1, then S-1 again for the pad)
    real: str  # [1] int64: S, where the attention output is cut back
    seqlens_k: str  # [B] int32: valid tokens - 1, counting the pad
    total_len: str  # [1] int32: the attention's total sequence length, counting the pad
    position_ids: str  # [B, S'] int64: the pad row one position after the last real token
    biases: dict[str, str]  # additive bias input -> [B, 1, S', T + D] (the pad column appended, open)
    exact: str  # [1] bool: m > 1, batch-invariant mode (attention computed call-invariantly, exact_attention.py)

    def pad(self, g: GraphWriter, x: str) -> str:
        """x [B, S, C] -> [B, S', C]."""
        return g.op("Gather", [x, self.rows], axis=1) if x else x

    def cut(self, g: GraphWriter, y: str, out: str) -> str:
        """y [B, S', C] -> out [B, S, C]."""
        return g.op("Slice", [y, g.const([0]), self.real, g.const([1])], outputs=[out])


def pad_attention_rows(g: GraphWriter, seqlens_k: str, total_len: str, biases: list[str]) -> AttentionRows:
    """Adds the attention_min_rows input and returns the padded attention inputs, for a graph whose input_ids
    [B, S] and position_ids [B, S] are graph inputs. (Lengths are one-element vectors, as the graph writer's
    constants are; Range takes them squeezed to scalars.)"""
    def scalar(x: str) -> str:
        return g.op("Squeeze", [x, g.const([0])])

    s = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const([1])], axis=0)  # [1]: S
    g.add_input(ATTENTION_ROWS_INPUT, TensorProto.INT64, [1])
    padded = g.op("Max", [s, ATTENTION_ROWS_INPUT])  # [1]: S' = max(S, m)
    extra = g.op("Sub", [padded, s])  # [1]: D = S' - S (0 or 1)
    steps = g.op("Range", [scalar(g.const([0])), scalar(padded), scalar(g.const([1]))])  # [S']: 0 .. S'-1
    rows = g.op("Min", [steps, g.op("Sub", [s, g.const([1])])])  # [S']: 0 .. S-1, S-1
    positions = g.op("Add", [g.op("Gather", ["position_ids", rows], axis=1), g.op("Sub", [steps, rows])])
    column = g.op("Concat", [g.const([0] * 7), extra], axis=0)  # Pad's [begins x 4, ends x 4]: D at the last end
    padded_biases = {b: g.op("Pad", [g.op("Gather", [b, rows], axis=2), column]) for b in biases}
    extra32 = g.op("Cast", [extra], to=TensorProto.INT32)
    return AttentionRows(rows=rows, real=s, seqlens_k=g.op("Add", [seqlens_k, extra32]),
                         total_len=g.op("Add", [total_len, extra32]), position_ids=positions, biases=padded_biases,
                         exact=g.op("Greater", [ATTENTION_ROWS_INPUT, g.const([1])]))
