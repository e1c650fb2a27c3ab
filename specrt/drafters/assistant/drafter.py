"""Drafting with Gemma 4's assistant (convert/assistant_graph.py): a chain, every step at the position of the pending
token, over the target's own KV cache.

For a context x_0..x_n (x_n the pending token, which the target has not read), the first step feeds x_n with the
target's last-layer features of slot n - 1 (the graph applies the target's final norm), each further step feeds the
token it drafted with its own hidden_out; all steps read the target's committed slots 0..n-1 (kv_length n) through
the target's cache buffers, bound as the graph's inputs (nothing copied). It keeps no cache of its own, so nothing is
rolled back after a verification. At temperature > 0 a chain samples from the assistant and passes its q.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.drafter_entry import DrafterEntry
from specrt.runtime.drafter import Draft, Drafter, TargetView, draft_chain
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.target_session import open_session


class AssistantDrafter(Drafter):
    name = "assistant"
    reads_hidden_states = True

    def __init__(self, bundle_dir: Path, entry: DrafterEntry, target_layers: int, providers, threads: int = 0):
        self.session = open_session(Path(bundle_dir) / entry.graph.file, threads, providers)
        self.sources = tuple(entry.target_layer_ids)
        self.width = entry.target_hidden_size
        self.last_layer = target_layers - 1
        self.max_context = entry.kv.max_context
        self.binding = self.session.io_binding()
        self.target: TargetView | None = None
        self.columns: np.ndarray | None = None
        self.params, self.rng = SamplingParams(temperature=0.0), np.random.default_rng()
        self.hidden: np.ndarray | None = None  # [1, 1, B] the last step's hidden_out
        # the graph's float type: float16 in a GPU bundle (it reads the target's float16 cache)
        features = next(i for i in self.session.get_inputs() if i.name == "features")
        self.dtype = np.float16 if "float16" in features.type else np.float32

    @classmethod
    def from_bundle(cls, bundle_dir, entry, manifest, providers, threads: int = 0) -> "AssistantDrafter":
        return cls(bundle_dir, entry, manifest.kv.layers, providers, threads=threads)

    def bind(self, target: TargetView) -> None:
        self.target, self.columns = target, target.columns([self.last_layer])
        for layer in self.sources:  # the target's cache buffers, bound once: read in place at every step
            keys, values = target.kv(layer)
            self.binding.bind_ortvalue_input(f"past_key_values.{layer}.key", keys)
            self.binding.bind_ortvalue_input(f"past_key_values.{layer}.value", values)

    def reset(self, params: SamplingParams | None = None, rng: np.random.Generator | None = None) -> None:
        self.params = params or SamplingParams(temperature=0.0)
        self.rng = rng if rng is not None else np.random.default_rng()

    def _step(self, token: int, position: int, features: np.ndarray | None) -> np.ndarray:
        """One draft step -> logits [V]: from the target's features (the first step) or from the previous step's
        hidden_out, which it replaces."""
        b, bind = self.width, self.binding
        zeros = np.zeros((1, 1, b), self.dtype)
        bind.bind_cpu_input("input_ids", np.array([[token]], dtype=np.int64))
        bind.bind_cpu_input("position_ids", np.array([[position]], dtype=np.int64))
        bind.bind_cpu_input("kv_length", np.array([position], dtype=np.int64))
        bind.bind_cpu_input("features", features.reshape(1, 1, b).astype(self.dtype) if features is not None else zeros)
        bind.bind_cpu_input("hidden", zeros if features is not None else self.hidden)
        bind.bind_cpu_input("use_features", np.array([features is not None]))
        bind.bind_output("logits", "cpu")
        bind.bind_output("hidden_out", "cpu")
        self.session.run_with_iobinding(bind)
        logits, self.hidden = (o.numpy() for o in bind.get_outputs())
        return logits[0, -1]

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        n = len(context) - 1  # the target has read context[:n]; context[n] is the pending token, at position n
        k = min(max_tokens, self.max_context - n)
        if self.target is None or n < 1 or k < 1:
            return None
        features = self.target.features(n - 1, n, self.columns)  # [1, B]
        logits = self._step(context[n], n, features)
        return draft_chain(logits, k, self.params, self.rng, lambda token: self._step(token, n, None))
