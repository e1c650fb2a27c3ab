"""Where a graph's quantized weights went, and the weights it really multiplies by, read back from its data file.

A projection's quantized rows may sit inside a fused MatMulNBits (q|k|v, gate|up) or a QMoE's stacked experts
(QuantRows); a written graph (WrittenGraph) reads any of them back, and QuantReadback serves every weight as the graph
holds it (dequantized) to the torch reference that validates it (convert/pipeline.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from specrt.convert.onnx_graph import ExternalData
from specrt.convert.quantize import QuantWeight, dequantize
from specrt.models.tensor_source import WeightSource, rows_of, shape_of


@dataclass(frozen=True)
class QuantRows:
    """Where one HF projection's quantized weights lie in the graph: rows lo, lo + step, ... below hi of a (maybe
    fused) MatMulNBits or QMoE (an expert's gate rows interleave with its up rows: step 2)."""

    qweight: str  # initializer names
    scales: str
    zero_points: str
    lo: int
    hi: int
    n: int  # the fused weight's rows, K, block size and bits per weight
    k: int
    block_size: int
    bits: int = 4
    step: int = 1
    mins: str = ""  # GGUF formats with per-block minimums: their initializer ([n_blocks, n], or [n, n_blocks] by row)
    mins_by_row: bool = False
    ggml_type: str = ""  # qweight: the GGUF file's own blocks of this type, rows interleaved by 8 (specrt's operators)
    columns: str = ""  # with ggml_type: the initializer int64 [K] of the HF column each of the blocks' columns holds

    @property
    def count(self) -> int:
        """The projection's own rows."""
        return len(range(self.lo, self.hi, self.step))


@dataclass
class WrittenGraph:
    """A graph written with external data: its files and where each projection's quantized weights went."""

    data: ExternalData
    quant_rows: dict[str, QuantRows]
    gguf_requantized: dict[str, str] = field(default_factory=dict)  # --precision gguf: weight -> its inexact type
    inputs: tuple[str, ...] = ()  # the graph's input names

    def quantized(self, name: str, rows: np.ndarray | None = None) -> QuantWeight:
        """A weight's quantized values (only `rows` of it, when given), read back from the data file: a
        projection's rows of its (maybe fused) MatMulNBits, or the embedding table's GatherBlockQuantized."""
        r = self.quant_rows[name]
        own = np.arange(r.count) if rows is None else np.asarray(rows, dtype=np.int64)
        pick = r.lo + r.step * own  # rows of the stored [n, ...] tensors
        span = None  # the rows to read: all, or only the range from the first to the last asked for
        if len(pick):
            span = (int(pick.min()), int(pick.max()) + 1, r.n)
            pick = pick - span[0]
        n = r.n if span is None else span[1] - span[0]
        if r.ggml_type:  # the file's own blocks: their exact form, as conversion read them
            from specrt.convert.gguf_exact import exact_weight
            from specrt.kernels.ggml_ops.layout import ROWS, deinterleave

            lo, hi = (0, r.n) if span is None else span[:2]
            groups = (lo // ROWS, -(-hi // ROWS), -(-r.n // ROWS))  # the groups of 8 rows holding lo .. hi - 1
            packed = self.data.read(r.qweight, groups).reshape(groups[1] - groups[0], -1)
            rows = deinterleave(r.ggml_type, packed, (groups[1] - groups[0]) * ROWS)[lo - ROWS * groups[0]:][:n]
            blocks = rows[pick]
            exact = exact_weight(r.ggml_type, blocks.tobytes(), (len(blocks), r.k))
            if not r.columns:
                return exact
            from specrt.convert.gguf_exact import reorder_exact

            source = np.argsort(self.data.read(r.columns))  # the file's column of each HF column
            return reorder_exact(exact, lambda a: np.asarray(a)[..., source])
        n_blocks = -(-r.k // r.block_size)
        packed = self.data.read(r.qweight, span).reshape(n, n_blocks, r.block_size * r.bits // 8)[pick]
        scales = self.data.read(r.scales, span).reshape(n, n_blocks)[pick].astype(np.float32)
        zero_points = self.data.read(r.zero_points, span).reshape(n, -1)[pick]
        mins = None
        if r.mins:
            if r.mins_by_row:
                mins = self.data.read(r.mins, span).reshape(n, n_blocks)[pick]
            else:  # [n_blocks, all rows]: small (a float per block), read whole
                mins = self.data.read(r.mins).reshape(n_blocks, r.n).T[pick + (span[0] if span else 0)]
            mins = mins.astype(np.float32).reshape(-1)
        return QuantWeight(packed, scales.reshape(-1), zero_points.reshape(-1), len(packed), r.k, r.block_size,
                           r.bits, mins)


class QuantReadback(WeightSource):
    """The weights a quantized graph really multiplies by: every weight it holds quantized (projections, the
    lm_head) dequantized from the values written to the data file, everything else as given. Read one tensor (or
    a few rows of one) at a time."""

    def __init__(self, weights: Mapping, written: WrittenGraph):
        self.base, self.written = weights, written
        self.names = list(weights) + (["lm_head.weight"] if "lm_head.weight" not in weights else [])

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.written.quant_rows:
            return dequantize(self.written.quantized(name))
        return self.base[name]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.base or name == "lm_head.weight"

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.written.quant_rows:
            r = self.written.quant_rows[name]
            return (r.count, r.k)
        return shape_of(self.base, name)

    def rows(self, name: str, ids) -> np.ndarray:
        if name not in self.written.quant_rows:
            return rows_of(self.base, name, ids)
        ids = np.asarray(ids, dtype=np.int64)
        unique, where = np.unique(ids, return_inverse=True)  # dequantize only the rows asked for
        return dequantize(self.written.quantized(name, unique))[where.reshape(ids.shape)]
