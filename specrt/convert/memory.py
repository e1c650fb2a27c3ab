"""Conversion's memory as a contract: the peak of every stage, and a refusal up front when a source cannot fit.

Per-stage peaks come from sampling the resident size while each stage runs, so each stage's figure is its own,
not the run's so far. The estimate takes the largest stage: ONNX Runtime holding the finished graph
(validation), the torch reference holding one layer (twice), or the builder converting the largest tensor;
plus the Python, torch and ONNX Runtime baseline.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from specrt.bundle import weight_bits
from specrt.errors import SpecrtError

GIB = 1 << 30
# Python + torch + onnxruntime + tokenizers (0.5 GiB) and a small drafter's stages (docs/performance.md,
# "Conversion time and peak memory", sets the estimates beside the measured peaks)
BASELINE_BYTES = int(1.0 * GIB)
# ONNX Runtime's resident size for a graph, per byte of its weights (measured, docs/performance.md, "Conversion
# time and peak memory"): int4's MatMulNBits with int8 activations repacks its weights with per-block sums (6.30 GiB
# resident for the 4.79 GiB of the Llama-3.1-8B shape's int4 graph); int8's MatMulNBits repacks the same way (taken
# as int4's, not measured)
SESSION_FACTOR = {"int4": 1.35, "int8": 1.35}
DEFAULT_SESSION_FACTOR = 1.15


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux /proc/self/statm), None elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


class StagePeaks:
    """Wraps a pipeline's Stages: records each stage's own peak resident memory and time. A thread samples the
    resident size every 20 ms (the kernel's high-water mark can be reset per stage, but that also resets what
    getrusage and /usr/bin/time report for the whole run)."""

    INTERVAL = 0.02

    def __init__(self, inner):
        self.inner, self.peaks = inner, {}
        self._name, self._t0, self._peak = None, 0.0, 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if resident_bytes() is not None:
            threading.Thread(target=self._sample, daemon=True, name="specrt-memory").start()

    def _sample(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            self._note()

    def _note(self) -> None:
        rss = resident_bytes() or 0
        with self._lock:
            self._peak = max(self._peak, rss)

    def expect(self, total: int) -> None:
        self.inner.expect(total)

    def start(self, name: str) -> None:
        with self._lock:
            self._name, self._t0, self._peak = name, time.time(), resident_bytes() or 0
        self.inner.start(name)

    def done(self) -> None:
        self._note()
        with self._lock:
            if self._name is not None and self._peak:
                self.peaks[self._name] = {"peak_gib": round(self._peak / GIB, 3),
                                          "seconds": round(time.time() - self._t0, 1)}
            self._name = None
        self.inner.done()

    def close(self) -> None:
        self._stop.set()

    def log(self, msg: str) -> None:
        self.inner.log(msg)

    def summary(self) -> str:
        return ", ".join(f"{name} {p['peak_gib']:.2f} GiB" for name, p in self.peaks.items())


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what can be used without swapping), None where unknown: the reader the
    runtime checks a KV cache's allocation with."""
    from specrt.runtime.target_session import available_memory

    return available_memory()


def graph_weight_bytes(shapes: Mapping, precision: str, block_size: int) -> int:
    """Bytes of a target graph's weights: projections and the embedding table (where its width is whole blocks)
    in int4/int8 (4 or 8 bits, a float scale and a 4- or 8-bit zero point per block) or at the precision's width,
    everything else float32 (fp16: 2 bytes)."""
    from specrt.convert.quantize import is_projection

    width = 2 if precision == "fp16" else 4
    bits = weight_bits(precision)
    total = 0
    for name, shape in shapes.items():
        count = 1
        for d in shape:
            count *= int(d)
        embedding = name == "model.embed_tokens.weight" and int(shape[-1]) % block_size == 0
        if bits and (is_projection(name) or embedding):
            total += count * bits // 8 + (count // block_size) * 4 + count // block_size * bits // 8
        else:
            total += count * width
    return total


def estimate_peak(shapes: Mapping, num_layers: int, precision: str, block_size: int, tied: bool,
                  kv_bytes: int = 0) -> int:
    """Bytes a conversion needs at its largest stage. The stages never overlap their big buffers: building holds
    the largest tensor being converted (read, widened, quantized; int4/int8 a chunk of a large one's rows), the
    torch reference one layer's float32
    weights twice (the source's and the int4 read-back) or the embedding table / lm_head, validation ONNX
    Runtime's copy of the finished graph and the KV cache of its session (kv_bytes)."""
    from specrt.convert.target_graph import QUANTIZE_READ_BYTES

    largest = layer = 0
    per_layer = [0] * num_layers
    for name, shape in shapes.items():
        count = 1
        for d in shape:
            count *= int(d)
        # int4/int8 read and quantize a large matrix a chunk of rows at a time (convert/target_graph.py)
        chunked = weight_bits(precision) and len(shape) == 2 and 4 * count > QUANTIZE_READ_BYTES
        largest = max(largest, QUANTIZE_READ_BYTES if chunked else 4 * count)
        if name.startswith("model.layers."):
            i = int(name.split(".")[2])
            if i < num_layers:
                per_layer[i] += 4 * count
    layer = max(per_layer, default=0)
    graph = dict(shapes)
    if tied and weight_bits(precision) and "model.embed_tokens.weight" in graph:
        graph["lm_head.weight"] = graph["model.embed_tokens.weight"]  # int4/int8 quantize a copy for the lm_head
    factor = SESSION_FACTOR.get(precision, DEFAULT_SESSION_FACTOR)
    session = graph_weight_bytes(graph, precision, block_size) * factor + kv_bytes
    return int(BASELINE_BYTES + max(session, 2 * layer, 3 * largest))


def check_fits(what: str, shapes: Mapping, num_layers: int, precision: str, block_size: int, tied: bool,
               kv_bytes: int = 0) -> int:
    """Refuse up front, in one line, a conversion that would need more memory than the machine has free."""
    need = estimate_peak(shapes, num_layers, precision, block_size, tied, kv_bytes)
    free = available_bytes()
    if free is not None and need > free:
        if precision != "int4":
            hint = "choose --precision int4"
        elif block_size < 128:
            hint = "choose --int4-block-size 128"
        else:
            hint = "this model does not fit this machine at int4"
        raise SpecrtError(f"converting {what} to {precision} needs about {need / GIB:.1f} GiB of memory; "
                          f"{free / GIB:.1f} GiB is available (close other programs, or {hint})")
    return need


def release_freed_memory() -> None:
    """Hand memory the process has freed back to the system (glibc keeps freed heap pages, so the resident size
    would still count what a finished stage, such as the torch reference, used); elsewhere nothing to do."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
