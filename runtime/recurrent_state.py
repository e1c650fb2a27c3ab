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
tokens: docs/perf.md, issue 34). A snapshot (a copy of the state at one length, taken at the end of each prompt)
lets the next chat turn reuse the prompt's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.bundle import RecurrentStates


@dataclass
class Capture:
    """What one call left to replay its prefixes: where it started, its tokens, and per layer its outputs."""

    start: int
    tokens: int
    conv: dict[int, np.ndarray]  # layer -> [B, S, C] the call's conv inputs
    recurrent: dict[int, np.ndarray]  # layer -> [B, capacity * (Hv + Hk * Dk + Hv * Dv)]


def replay_conv(before: np.ndarray, inputs: np.ndarray, kept: int, out: np.ndarray) -> None:
    """before [B, K - 1, C]; inputs [B, S, C]; writes the conv state after `kept` inputs into out [B, K - 1, C]."""
    width = before.shape[1]
    joined = np.concatenate([before, inputs[:, :kept]], axis=1)  # [B, K - 1 + kept, C]
    out[...] = joined[:, -width:]


def split_capture(row: np.ndarray, st: RecurrentStates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One request's capture [capacity * (...)] -> decay [cap, Hv], key [cap, Hk, Dk], delta [cap, Hv, Dv]."""
    cap, hv, hk = st.capacity, st.value_heads, st.key_heads
    a, b = cap * hv, cap * hv + cap * hk * st.key_dim
    return (row[:a].reshape(cap, hv), row[a:b].reshape(cap, hk, st.key_dim),
            row[b:].reshape(cap, hv, st.value_dim))


def replay_recurrent(before: np.ndarray, capture: np.ndarray, kept: int, st: RecurrentStates,
                     out: np.ndarray) -> None:
    """before [B, Hv, Dv, Dk]; capture [B, capacity * (...)]; writes the state after `kept` transitions into out,
    token by token as the op itself steps (S *= decay; S += key (x) delta, in float32, in that order): the result
    equals the op's own state after those tokens bit for bit, so speculation keeps greedy output exact."""
    groups = st.value_heads // st.key_heads  # value head h reads key head h // groups
    for b in range(before.shape[0]):
        decay, key, delta = split_capture(capture[b], st)
        out[b] = before[b]
        for t in range(kept):
            np.multiply(out[b], decay[t][:, None, None], out=out[b])
            keys = np.repeat(key[t], groups, axis=0)  # [Hv, Dk]
            out[b] += delta[t][:, :, None] * keys[:, None, :]  # [Hv, Dv, 1] x [Hv, 1, Dk]

class StateBuffers:
    """Ping-pong conv and recurrent buffers per linear layer, the last call's capture and one snapshot."""

    def __init__(self, st: RecurrentStates, batch: int, dtype):
        self.layout = st
        self.conv = [{i: np.zeros((batch, *st.conv_shape), dtype) for i in st.layers} for _ in range(2)]
        self.recurrent = [{i: np.zeros((batch, *st.recurrent_shape), np.float32) for i in st.layers}
                          for _ in range(2)]
        self.current = 0  # the buffer holding the state at the cache's length
        self.capture: Capture | None = None
        self.snapshot_length: int | None = None
        self.snapshot: tuple[dict, dict] | None = None

    def nbytes(self) -> int:
        return 2 * sum(a.nbytes for a in (*self.conv[0].values(), *self.recurrent[0].values()))

    def clear(self) -> None:
        """The zero state (an empty cache); the snapshot goes with the cache's contents."""
        self.snapshot_length = None
        for array in (*self.conv[self.current].values(), *self.recurrent[self.current].values()):
            array.fill(0)
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
            for i in self.layout.layers:
                replay_conv(self.conv[before][i], cap.conv[i], kept, self.conv[after][i])
                replay_recurrent(self.recurrent[before][i], cap.recurrent[i], kept, self.layout,
                                 self.recurrent[after][i])
            self.capture = None  # the buffer the capture replays into now holds a prefix: replay no further
            return
        if length == 0:
            self.clear()
            return
        if self.snapshot_length == length and self.snapshot is not None:
            for i in self.layout.layers:
                self.conv[self.current][i][...] = self.snapshot[0][i]
                self.recurrent[self.current][i][...] = self.snapshot[1][i]
            self.capture = None
            return
        raise ValueError(f"the recurrent state cannot be rolled back to {length} (it holds {now})")

    def take_snapshot(self, length: int) -> None:
        if self.snapshot is None:
            self.snapshot = ({i: a.copy() for i, a in self.conv[self.current].items()},
                             {i: a.copy() for i, a in self.recurrent[self.current].items()})
        else:
            for i in self.layout.layers:
                self.snapshot[0][i][...] = self.conv[self.current][i]
                self.snapshot[1][i][...] = self.recurrent[self.current][i]
        self.snapshot_length = length
