"""The recurrent and conv states of a hybrid target's linear-attention layers (Gated DeltaNet), beside its KV cache.

A recurrent state cannot be rolled back by a length. Each state lives in two preallocated buffers (ping-pong): a
call reads the state at the cache's length from one and writes the state after its last token into the other, so
the state before the call survives it. With the call's captured transitions (convert/linear_attention_graph.py),
the state after any prefix of the call is rebuilt from the state before it without running the target again:

  conv       the last K - 1 rows of concat(conv state before, the call's conv inputs[:kept])
  recurrent  for each kept token t: S *= decay_t; S += key_t (x) delta_t

which is ONNX Runtime's GatedDeltaNetStateReplay recurrence, stepped as the op steps, so the replayed state equals
the op's own state after those tokens bit for bit (a closed form, prod(decay) S_0 + sum of scaled updates, costs
one pass instead of two per token but rounds differently, and on a random-weight 9B model that changed greedy
tokens: docs/performance.md, "Losslessness and batch-invariant calls"). A snapshot (a copy of the state at one
length, taken at the end of each prompt) lets the next chat turn reuse the prompt's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.bundle import RecurrentStates
from specrt.kernels.state_replay import replay_conv, replay_recurrent


@dataclass
class Capture:
    """What one call left to replay its prefixes: where it started, its tokens, and per layer its outputs."""

    start: int
    tokens: int
    conv: dict[int, np.ndarray]  # layer -> [B, S, C] the call's conv inputs
    recurrent: dict[int, np.ndarray]  # layer -> [B, capacity * (Hv + Hk * Dk + Hv * Dv)]


class StateBuffers:
    """Ping-pong conv and recurrent buffers per linear layer, the last call's capture and one snapshot.

    On the CPU the buffers are numpy arrays (the OrtValues the session binds wrap their memory) and the replay is
    the numpy twin; on a GPU (device "cuda") they are OrtValues in device memory, seen by torch through DLPack, the
    captures stay on the device and the replay is the Triton kernel (kernels/state_replay.py): no copy through the
    host. kernel_replay runs the kernel on host buffers too (tests, under TRITON_INTERPRET=1)."""

    def __init__(self, st: RecurrentStates, batch: int, dtype, device: str = "cpu"):
        self.layout, self.device = st, device
        self.kernel_replay = False
        shapes = {"conv": ((batch, *st.conv_shape), dtype)}
        if st.has_recurrent:  # a short convolution (LFM2) keeps only its conv state
            shapes["recurrent"] = ((batch, *st.recurrent_shape), np.float32)
        # kind -> [two buffers of {layer: OrtValue}], and the arrays (numpy, or torch views on a GPU) over them
        self.values = {kind: [{i: self._allocate(shape, t) for i in st.layers} for _ in range(2)]
                       for kind, (shape, t) in shapes.items()}
        view = (lambda v: v.numpy()) if device == "cpu" else _torch_view
        self.conv = [{i: view(v) for i, v in buffers.items()} for buffers in self.values["conv"]]
        self.recurrent = [{i: view(v) for i, v in buffers.items()} for buffers in self.values.get("recurrent", [{}, {}])]
        self.current = 0  # the buffer holding the state at the cache's length
        self.capture: Capture | None = None
        self.snapshot_length: int | None = None
        self.snapshot: tuple[dict, dict] | None = None

    def _allocate(self, shape, dtype):
        import onnxruntime as ort

        if self.device == "cpu":
            return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype))
        value = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.device, 0)
        _torch_view(value).zero_()
        return value

    def capture_arrays(self, values) -> list:
        """The call's capture outputs as arrays where they live (numpy on the host, torch views on a GPU)."""
        return [v.numpy() for v in values] if self.device == "cpu" else [_torch_view(v) for v in values]

    def nbytes(self) -> int:
        return 2 * sum(a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.element_size()
                       for a in (*self.conv[0].values(), *self.recurrent[0].values()))

    def clear(self) -> None:
        """The zero state (an empty cache); the snapshot goes with the cache's contents."""
        self.snapshot_length = None
        for array in (*self.conv[self.current].values(), *self.recurrent[self.current].values()):
            array[...] = 0
        self.capture = None

    def after_call(self, capture: Capture) -> None:
        """A call read buffer `current` and wrote the other one."""
        self.current = 1 - self.current
        self.capture = capture

    def reachable(self, length: int, now: int) -> int:
        """The longest length <= `length` whose state can be restored (now: the cache's length)."""
        best = 0
        if now <= length:
            best = now
        elif self.capture is not None and self.capture.start <= length <= self.capture.start + self.layout.capacity:
            best = length  # inside the last call's captured prefix: replayed
        if self.snapshot_length is not None and best < self.snapshot_length <= length:
            best = self.snapshot_length
        return best

    def restore(self, length: int, now: int) -> None:
        """Make buffer `current` hold the state at `length` (one of reachable's answers). A snapshot past `length`
        is dropped: the tokens after `length` are about to be replaced, and it would describe the old ones."""
        if self.snapshot_length is not None and length < self.snapshot_length:
            self.snapshot_length = None
        if length == now:
            return
        cap = self.capture
        if cap is not None and cap.start <= length < now and length - cap.start <= self.layout.capacity:
            before, after = 1 - self.current, self.current
            kept = length - cap.start
            lay = self.layout
            host = self.kernel_replay and self.device == "cpu"  # the kernel over host memory (tests)
            for i in lay.layers:
                replay_conv(self.conv[before][i], cap.conv[i], kept, self.conv[after][i])
                if not lay.has_recurrent:
                    continue
                state = (self.recurrent[before][i], cap.recurrent[i], self.recurrent[after][i])
                if host:
                    import torch

                    state = tuple(torch.from_numpy(a) for a in state)
                replay_recurrent(state[0], state[1], kept, lay.capacity, lay.key_heads, state[2])
            self.capture = None  # the buffer the capture replays into now holds a prefix: replay no further
            return
        if length == 0:
            self.clear()
            return
        if self.snapshot_length == length and self.snapshot is not None:
            for i in self.layout.layers:
                self.conv[self.current][i][...] = self.snapshot[0][i]
                if self.layout.has_recurrent:
                    self.recurrent[self.current][i][...] = self.snapshot[1][i]
            self.capture = None
            return
        raise ValueError(f"the recurrent state cannot be rolled back to {length} (it holds {now})")

    def take_snapshot(self, length: int) -> None:
        if self.snapshot is None:
            copy = (lambda a: a.copy()) if self.device == "cpu" else (lambda a: a.clone())
            self.snapshot = ({i: copy(a) for i, a in self.conv[self.current].items()},
                             {i: copy(a) for i, a in self.recurrent[self.current].items()})
        else:
            for i in self.layout.layers:
                self.snapshot[0][i][...] = self.conv[self.current][i]
                if self.layout.has_recurrent:
                    self.snapshot[1][i][...] = self.recurrent[self.current][i]
        self.snapshot_length = length


def _torch_view(value):
    """A torch tensor over an OrtValue's device memory (DLPack: no copy)."""
    import torch

    return torch.from_dlpack(value)

