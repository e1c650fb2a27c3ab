"""One ONNX Runtime session over the target graph, with a preallocated in-place KV cache.

The cache is one OrtValue per layer and per key/value, [batch, kv_heads, max_context + 1, head_dim],
bound both as `past_key_values.{i}.*` and as `present.{i}.*` through IOBinding, so that
GroupQueryAttention writes the new tokens' keys/values into their slots in place: no per-step
allocation of the cache and no copy of it. Rolling back is setting `length` back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from specrt.bundle import (ATTENTION_ROWS_INPUT, EXPERT_CALLS_INPUT, SEQLENS_INPUT, TOTAL_LENGTH_INPUT,
                           RecurrentStates)
from specrt.errors import BundleError, SpecrtError
from specrt.kernels import ggml_ops
from specrt.kernels.kv_compact import kv_compact_ref
from specrt.runtime.recurrent_state import Capture, StateBuffers


@dataclass(frozen=True)
class TargetSpec:
    """What the session needs to know about the graph (read from the bundle manifest)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    vocab_size: int
    kv_dtype: str = "float32"  # float32 | float16
    hidden_output: bool = False
    sliding_window: int = 0  # > 0: the graph has a sliding_attention_bias input
    extra_outputs: tuple[str, ...] = ()  # further outputs returned after the logits (EAGLE-3: hidden_out)
    hidden_width: int = 0  # width of the hidden_states output the manifest implies (layers x hidden size)
    kv_layers: tuple[int, ...] = ()  # the layers with a KV cache (empty: all of them)
    states: RecurrentStates | None = None  # hybrids: the linear-attention layers' states
    kv_shapes: tuple[tuple[int, int], ...] = ()  # per cached layer (KV heads, head size) where they differ (Gemma 4)

    @property
    def cached_layers(self) -> tuple[int, ...]:
        return self.kv_layers or tuple(range(self.num_layers))

    def layer_kv_shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head size) of each cached layer."""
        return self.kv_shapes or ((self.num_kv_heads, self.head_dim),) * len(self.cached_layers)


class ContextOverflowError(SpecrtError):
    """More tokens than the bundle's max context."""


def make_session_options(threads: int = 0, model_path=None) -> ort.SessionOptions:
    """Session options for a bundle's graph; a graph with specrt's GGUF operators (kernels/ggml_ops) gets them."""
    opts = ort.SessionOptions()
    if model_path is not None and ggml_ops.graph_uses(model_path):
        ggml_ops.register(opts)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    # Threads spin while a run lasts but stop when it returns: otherwise a session's idle pool spins on
    # the cores the next session (draft model <-> target) needs; measured in docs/performance.md, "What a target
    # call costs by its width".
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    if os.environ.get("SPECRT_NO_CPU_FALLBACK") == "1":  # bench/gpu.sh: a node left to the CPU fails the session
        opts.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if os.environ.get("SPECRT_PROFILE_PREFIX"):  # bench/gpu_families.py: per-node provider, read from the profile
        opts.enable_profiling = True
        opts.profile_file_prefix = os.environ["SPECRT_PROFILE_PREFIX"]
    return opts


def open_session(model_path, threads: int = 0, providers=("CPUExecutionProvider",), kv_layers=None,
                 kv_shapes=None, widths: dict[str, int] | None = None):
    """An ONNX Runtime session for a bundle's graph; a graph ONNX Runtime cannot load (corrupt, truncated, not
    ONNX) or whose KV inputs disagree with the manifest's layer count is a one-line BundleError naming it."""
    providers = list(providers)
    if os.environ.get("SPECRT_NO_CPU_FALLBACK") == "1" and len(providers) > 1:
        providers = [p for p in providers if p != "CPUExecutionProvider"]  # listed, it would conflict with the flag
    opts = make_session_options(threads, model_path)  # a BundleError of its own where specrt's operators are missing
    try:
        session = ort.InferenceSession(str(model_path), opts, providers=providers)
    except Exception as exc:  # InvalidProtobuf, Fail, RuntimeError...: ORT's own messages span lines
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BundleError(f"{model_path}: ONNX Runtime cannot load this graph ({first[:200]})") from None
    if kv_layers is not None:  # a layer count, or the layer ids that have a KV cache
        layers = range(kv_layers) if isinstance(kv_layers, int) else kv_layers
        names = {i.name for i in session.get_inputs()}
        have = sum(1 for n in names if n.startswith("past_key_values.") and n.endswith(".key"))
        if have != len(layers) or any(f"past_key_values.{i}.key" not in names for i in layers):
            raise BundleError(f"{model_path}: the graph has {have} layers of KV inputs, the manifest says {len(layers)}")
    if kv_shapes is not None:  # one (KV heads, head size) pair per cached layer (kv_layers)
        layers = range(kv_layers) if isinstance(kv_layers, int) else kv_layers
        inputs = {i.name: i.shape for i in session.get_inputs()}
        for layer, want in zip(layers, kv_shapes):
            shape = inputs.get(f"past_key_values.{layer}.key")
            if shape is not None and len(shape) == 4 and [shape[1], shape[3]] != list(want):
                raise BundleError(f"{model_path}: the graph's KV heads x head size are {shape[1]} x {shape[3]}, the "
                                  f"manifest says {want[0]} x {want[1]}")
    outputs = {o.name: o.shape for o in session.get_outputs()}
    for name, width in (widths or {}).items():  # last dimension of an output, where the graph states it
        last = (outputs.get(name) or [None])[-1]
        if isinstance(last, int) and last != width:
            raise BundleError(f"{model_path}: its {name} output is {last} wide, the manifest implies {width}")
    return session


def available_memory() -> int | None:
    """Bytes of memory the machine can still give (MemAvailable), or None where that is not known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


class TargetSession:
    def __init__(self, model_path: str, spec: TargetSpec, providers=("CPUExecutionProvider",), batch: int = 1, threads: int = 0):
        self.spec, self.batch = spec, batch
        self.np_dtype = np.float16 if spec.kv_dtype == "float16" else np.float32
        # one slot past max_context: a graph whose attention pads a one-token call to two rows writes the pad's key
        # and value in the slot after the token's (convert/attention_rows.py)
        shapes = [(batch, heads, spec.max_context + 1, dim) for heads, dim in spec.layer_kv_shapes()]
        # the cache lives where the model runs: device memory under CUDA, host memory otherwise
        self.device = "cuda" if list(providers)[0] == "CUDAExecutionProvider" else "cpu"
        layers = spec.cached_layers
        need = 2 * sum(int(np.prod(shape)) for shape in shapes) * np.dtype(self.np_dtype).itemsize
        free = available_memory()
        if self.device == "cpu" and free is not None and need > free:
            raise BundleError(f"{model_path}: its KV cache ({spec.num_layers} layers x {spec.max_context} tokens) needs "
                              f"{need / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB this machine has free "
                              f"(convert with a smaller --max-context)")
        widths = {"logits": spec.vocab_size}
        if spec.hidden_width:
            widths["hidden_states"] = spec.hidden_width
        self.session = open_session(model_path, threads, providers, layers if spec.kv_layers else spec.num_layers,
                                    spec.layer_kv_shapes(), widths)
        if spec.states is not None:
            names = {x.name for x in self.session.get_inputs()}
            missing = [(kind, i) for i in spec.states.layers for kind in spec.states.kinds
                       if f"past_{kind}.{i}" not in names]
            if missing:
                raise BundleError(f"{model_path}: the graph lacks the {missing[0][0]} state of layer {missing[0][1]}, "
                                  "which the manifest lists")
        self.host_arrays: list[np.ndarray] = []
        self.keys = [self._kv_buffer(shape) for shape in shapes]
        self.values = [self._kv_buffer(shape) for shape in shapes]
        self.length = 0  # tokens committed to the cache; slot j holds position j (trees are compacted)
        # 2 = batch-invariant numerics: a one-row call rounds differently from a call of several rows (whose
        # results agree with each other bit for bit: GroupQueryAttention's weights x V GEMM sends one row to MLAS's
        # separate M = 1 kernel; docs/performance.md, "Losslessness and batch-invariant calls"), so a one-token call
        # is padded with a copy of its token in the next slot, then that slot is dropped.
        self.min_rows = 1
        # with min_rows 2, also pad odd row counts to even: at int4 blocks of 64 or 128 weights MatMulNBits
        # handles the last row of an odd count alone, so only even counts agree with each other
        # (docs/performance.md, "Losslessness and batch-invariant calls")
        self.even_rows = False
        self.kernel_compaction = False  # True: compact with the Triton kernel even on a host cache (tests)
        # graphs with an attention_min_rows input: the fewest rows each attention runs (2: a one-token call rounds as
        # a multi-token call does, exact without padding the whole call; convert/attention_rows.py)
        inputs = {i.name for i in self.session.get_inputs()}
        self.has_attention_rows = ATTENTION_ROWS_INPUT in inputs
        self.attention_min_rows = 1
        # MoE graphs with exact calls: each token's experts in a call of their own (convert/moe_graph.py)
        self.has_expert_calls = EXPERT_CALLS_INPUT in inputs
        # GPU graphs take no attention bias (convert/gpu_profile.py): chains only, masked causally inside the op
        self.has_bias = "attention_bias" in inputs
        self.has_total_length = TOTAL_LENGTH_INPUT in inputs
        self.has_seqlens = SEQLENS_INPUT in inputs  # rocm: no attention_mask
        self.experts_token_by_token = False
        # hybrids: the linear layers' states in ping-pong buffers (runtime/recurrent_state.py), one binding per
        # direction; the outputs before the logits are the caches, then the states and their captures
        self.states = StateBuffers(spec.states, batch, self.np_dtype, self.device) if spec.states is not None else None
        self.bindings = [self._bind(direction) for direction in ((0, 1), (1, 0))[:2 if self.states else 1]]
        self.binding = self.bindings[0]
        # per state layer a present and a capture of each kind
        self.first_output = 2 * len(layers) + (2 * len(spec.states.kinds) * len(spec.states.layers)
                                               if spec.states else 0)

    def _bind(self, direction: tuple[int, int]):
        """An IOBinding with the KV cache bound in place and, for hybrids, the states read from buffer direction[0]
        and written to buffer direction[1]."""
        binding = self.session.io_binding()
        for j, i in enumerate(self.spec.cached_layers):
            binding.bind_ortvalue_input(f"past_key_values.{i}.key", self.keys[j])
            binding.bind_ortvalue_input(f"past_key_values.{i}.value", self.values[j])
            binding.bind_ortvalue_output(f"present.{i}.key", self.keys[j])
            binding.bind_ortvalue_output(f"present.{i}.value", self.values[j])
        if self.states is not None:
            src, dst = direction
            for kind, buffers in self.states.values.items():  # conv, recurrent: OrtValues bound in place
                for i in self.spec.states.layers:
                    binding.bind_ortvalue_input(f"past_{kind}.{i}", buffers[src][i])
                    binding.bind_ortvalue_output(f"present_{kind}.{i}", buffers[dst][i])
            self._bind_captures(binding)
        return binding

    def _bind_captures(self, binding) -> None:
        """The capture outputs, unallocated (their length follows the call's): bound again before every call."""
        for i in self.spec.states.layers:  # where the session runs: a GPU's captures stay on the device
            for kind in self.spec.states.kinds:
                binding.bind_output(f"capture_{kind}.{i}", self.device)

    @property
    def recurrent(self) -> bool:
        """The target carries a recurrent state: rolled back by replaying the last call, or to a snapshot."""
        return self.states is not None

    def _kv_buffer(self, shape) -> ort.OrtValue:
        if self.device == "cpu":
            array = np.zeros(shape, self.np_dtype)
            self.host_arrays.append(array)  # the OrtValue wraps this memory: compaction gathers in it
            return ort.OrtValue.ortvalue_from_numpy(array)
        # slots past `length` are never read (GroupQueryAttention reads seqlens_k + 1 of them)
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, self.np_dtype, self.device, 0)

    def compact(self, dst: int, src_slots: list[int]) -> None:
        """Move the KV of `src_slots` (an accepted tree path) to slots dst, dst + 1, ... (one gather per buffer)."""
        if not src_slots or list(src_slots) == list(range(dst, dst + len(src_slots))):
            return
        if self.states is not None:
            raise SpecrtError("a tree's accepted path cannot be kept on a recurrent target (its state follows one chain)")
        if self.device != "cpu" or self.kernel_compaction:
            import torch

            from specrt.kernels.kv_compact import kv_compact

            for value in (*self.keys, *self.values):  # the OrtValue's memory seen by torch (DLPack, no copy)
                buffer = torch.from_dlpack(value)
                kv_compact(buffer, dst, torch.tensor(src_slots, dtype=torch.int64, device=buffer.device))
            return
        for array in self.host_arrays:
            kv_compact_ref(array, dst, np.asarray(src_slots))

    def reset(self) -> None:
        self.length = 0
        if self.states is not None:
            self.states.clear()

    def reachable(self, length: int) -> int:
        """The longest length <= `length` the cache can be rolled back to: any, for a KV cache; for a recurrent
        state, one inside the last call, the snapshot's, or 0."""
        length = min(length, self.length)
        return length if self.states is None else self.states.reachable(length, self.length)

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length} (cache holds {self.length})")
        if self.states is not None:
            self.states.restore(length, self.length)
        self.length = length

    def snapshot(self) -> None:
        """Remember the recurrent state at the current length (a later prompt sharing this prefix restores it)."""
        if self.states is not None:
            self.states.take_snapshot(self.length)

    def _sliding_bias(self, position_ids: np.ndarray, attention_bias: np.ndarray) -> np.ndarray:
        """attention_bias plus -inf where a key lies `sliding_window` or more positions behind the query."""
        b, s = position_ids.shape
        past = np.broadcast_to(np.arange(self.length, dtype=np.int64), (b, self.length))
        key_pos = np.concatenate([past, position_ids], axis=1)  # [B, T]
        too_far = position_ids[:, :, None] - key_pos[:, None, :] >= self.spec.sliding_window  # [B, S, T]
        window = np.where(too_far[:, None], -np.inf, 0.0).astype(self.np_dtype)
        return np.ascontiguousarray(attention_bias + window, dtype=self.np_dtype)

    def padded_rows(self, s: int) -> int:
        """How many rows a call of s new tokens feeds: at least min_rows, and an even count when even_rows."""
        rows = max(s, self.min_rows)
        if self.even_rows and self.min_rows > 1 and rows % 2:
            rows += 1
        return rows

    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray | None = None, attention_bias: np.ndarray | None = None,
                device_logits: bool = False, extra_inputs: dict | None = None):
        """input_ids [B, S] -> logits [B, S, V] (and hidden_states [B, S, F] when the graph has them).

        device_logits: return the logits as a torch tensor over ONNX Runtime's own output buffer, where the
        session runs (GPU memory under CUDA), through DLPack: no copy through host memory.

        The new tokens take cache slots length .. length + S - 1 and `length` advances by S.
        position_ids default to the slot numbers; attention_bias [B, 1, S, length + S] is additive.
        """
        b, s = input_ids.shape
        rows = self.padded_rows(s)
        if rows > s and position_ids is None and attention_bias is None and not extra_inputs \
                and self.length + rows <= self.spec.max_context:
            pad = np.repeat(input_ids[:, -1:], rows - s, axis=1)
            out = self.forward(np.concatenate([input_ids, pad], axis=1), device_logits=device_logits)
            self.rollback(self.length - (rows - s))  # the pad's slots (and state transitions) are rolled back
            return tuple(o[:, :s] for o in out) if isinstance(out, tuple) else out[:, :s]
        total = self.length + s
        if total > self.spec.max_context:
            raise ContextOverflowError(f"{total} tokens exceed the bundle's max context {self.spec.max_context}")
        if position_ids is None:
            position_ids = np.broadcast_to(np.arange(self.length, total, dtype=np.int64), (b, s))
        if attention_bias is not None and not self.has_bias:
            raise SpecrtError("this bundle's graph takes no attention bias (a GPU graph: chains only), so it cannot "
                              "verify a tree draft: use a chain drafter (eagle3, mtp, not eagle3:tree / mtp:tree)")
        if attention_bias is None and self.has_bias:
            attention_bias = np.zeros((b, 1, s, total), dtype=self.np_dtype)
        bind = self.bindings[self.states.current] if self.states is not None else self.binding
        if self.states is not None:
            self._bind_captures(bind)
        bind.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
        bind.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids, dtype=np.int64))
        if self.has_seqlens:
            bind.bind_cpu_input(SEQLENS_INPUT, np.full(b, total - 1, dtype=np.int32))
        else:
            bind.bind_cpu_input("attention_mask", np.ones((b, total), dtype=np.int64))
        if self.has_bias:
            bind.bind_cpu_input("attention_bias", np.ascontiguousarray(attention_bias, dtype=self.np_dtype))
        if self.has_total_length:
            bind.bind_cpu_input(TOTAL_LENGTH_INPUT, np.array(total, dtype=np.int32))
        if self.spec.sliding_window:
            bind.bind_cpu_input("sliding_attention_bias", self._sliding_bias(position_ids, attention_bias))
        if self.has_attention_rows:
            bind.bind_cpu_input(ATTENTION_ROWS_INPUT, np.array([self.attention_min_rows], dtype=np.int64))
        if self.has_expert_calls:
            bind.bind_cpu_input(EXPERT_CALLS_INPUT, np.array([int(self.experts_token_by_token)], dtype=np.int64))
        # unallocated (the shape varies): on the host for numpy sampling, or where the session runs
        bind.bind_output("logits", self.device if device_logits else "cpu")
        for name, value in (extra_inputs or {}).items():
            bind.bind_cpu_input(name, np.ascontiguousarray(value))
        if self.spec.hidden_output:
            bind.bind_output("hidden_states", "cpu")
        for name in self.spec.extra_outputs:
            bind.bind_output(name, "cpu")
        self.session.run_with_iobinding(bind)
        outs = bind.get_outputs()  # in binding order: the caches, states and captures, logits, hidden_states
        first = self.first_output
        if self.states is not None:
            layers, kinds = self.spec.states.layers, len(self.spec.states.kinds)
            base = first - kinds * len(layers)
            captured = self.states.capture_arrays(outs[base:first])  # per layer: conv (, recurrent)
            self.states.after_call(Capture(self.length, s, dict(zip(layers, captured[0::kinds])),
                                           dict(zip(layers, captured[1::kinds])) if kinds == 2 else {}))
        self.length = total
        if device_logits:
            import torch

            logits = torch.from_dlpack(outs[first])
        else:
            logits = outs[first].numpy()
        rest = [o.numpy() for o in outs[first + 1:]]  # hidden_states, then the extra outputs, in binding order
        return (logits, *rest) if rest else logits
