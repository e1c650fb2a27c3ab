"""The drafter contract: what the draft-verify loop asks of a drafter, and what it gives one.

A drafter proposes a Draft (tokens + parent per token + optional q) continuing the context. A chain is the special
case parents = [-1, 0, 1, ...]; parent -1 means "follows the pending token" (the last token already chosen but not
yet verified by the target). `probs[i]` is the draft distribution the i-th token was sampled from (over the target
vocabulary); None means the drafter has none (n-gram, greedy drafting), which the verifier treats as one-hot on
the drafted token.

Every drafter subclasses `Drafter`. Its optional capabilities are declared members with defaults, which the loop
(runtime/speculative.py, runtime/engine.py) reads without probing:
- `reads_hidden_states`: the drafter reads the target's hidden-state taps; the loop binds it to a TargetView (the
  taps per cache slot and the target's KV cache buffers, read-only) before the first proposal. A drafter is never
  handed the engine.
- `block_drafter`: one call drafts a whole block (its cost does not grow with the draft length).
- `max_draft`: draft tokens per call the loop may ask for (None: the loop's own), e.g. a tree's node count.
- `catchup_seconds`: of the last propose, the time spent reading context it had not seen (not drafting cost).
- `members`: the drafters a mix picks among (itself for a single drafter).
- `prefill(prompt)`: read the prompt before the first proposal (a draft model's own cache).
- `use_costs(seconds)`: the loop's measured target-call cost by tokens fed, for drafters that cut their draft.
- `backlog(context)`: how many context tokens it would read before drafting (a head that has not seen the prompt
  or a stretch of plain decoding); the loop does not probe a drafter with a long backlog (runtime/speculative.py).

Drafters may import this module and the runtime's building blocks runtime/sampling.py and runtime/target_session.py
(an ONNX session with a preallocated KV cache, for a drafter's own graph); nothing else of the runtime
(docs/architecture.md, enforced by tests/test_architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.errors import BundleError
from specrt.runtime.sampling import target_probs


@dataclass(frozen=True)
class Draft:
    tokens: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64, -1 for children of the pending token; parents[i] < i
    probs: np.ndarray | None = None  # [n, V] float

    @staticmethod
    def chain(tokens, probs=None) -> "Draft":
        tokens = np.asarray(tokens, dtype=np.int64)
        return Draft(tokens, np.arange(len(tokens), dtype=np.int64) - 1, probs)

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> np.ndarray:
        """Depth of each token below the pending token (children of the pending token have depth 1)."""
        d = np.zeros(len(self.tokens), dtype=np.int64)
        for i, p in enumerate(self.parents):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parents, np.arange(len(self.tokens)) - 1))


def draft_chain(logits: np.ndarray, k: int, params, rng: np.random.Generator, step) -> Draft:
    """A k-token chain from a drafter's logits over the target vocabulary [V]: each token its argmax (greedy) or a
    draw from target_probs (whose q the draft carries); step(token) feeds a token and returns the next logits."""
    tokens, probs = [], []
    for i in range(k):
        if params.greedy:
            token = int(np.argmax(logits))
        else:
            q = target_probs(logits, params)  # [V_target]
            token = int(rng.choice(len(q), p=q))
            probs.append(q)
        tokens.append(token)
        if i + 1 < k:
            logits = step(token)
    return Draft.chain(tokens, np.stack(probs) if probs else None)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (what a KV cache can keep). Slices compare in C: a
    whole-prefix match (the common case: a cache that holds a prefix of the context) costs one comparison, else a
    bisection over prefix lengths."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class TargetTaps:
    """The target's hidden-state taps per cache slot: the residual stream after `layers`, concatenated
    [max_context, len(layers) * hidden_size]. The engine writes a row per token it feeds and keeps the rows in
    step with its KV cache; drafters read them through a TargetView."""

    def __init__(self, layers: tuple[int, ...], hidden_size: int, max_context: int):
        self.layers, self.hidden_size = tuple(layers), hidden_size
        self.rows = np.zeros((max_context, len(self.layers) * hidden_size), np.float32)  # [max_context, F]

    def write(self, start: int, hidden: np.ndarray) -> None:  # hidden [S, F] of the tokens fed at slot start
        self.rows[start:start + len(hidden)] = hidden

    def keep_path(self, dst: int, path: list[int]) -> None:
        """After a tree verification: the accepted path's rows move to slots dst, dst + 1, ..."""
        if path:
            self.rows[dst:dst + len(path)] = self.rows[path]


class TargetView:
    """What a drafter may read of the target: its hidden-state taps of the tokens it has read and its KV cache
    (both read-only)."""

    def __init__(self, taps: TargetTaps, cache=None):
        self._taps, self._cache = taps, cache  # cache: the target's TargetSession

    def kv(self, layer: int):
        """The target's cache buffers of one layer, (keys, values) OrtValues [B, KV, max_context + 1, D], to bind
        as a graph's inputs (Gemma 4's assistant reads them); slots at and past the committed length are garbage."""
        if self._cache is None or layer not in self._cache.spec.cached_layers:
            raise BundleError(f"the drafter reads the KV cache of target layer {layer}, which the target has not")
        j = self._cache.spec.cached_layers.index(layer)
        return self._cache.keys[j], self._cache.values[j]

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self._taps.layers

    def columns(self, layers) -> np.ndarray:
        """Columns of the taps holding these layers, in this order [len(layers) * hidden_size]."""
        h = self._taps.hidden_size
        missing = [layer for layer in layers if layer not in self._taps.layers]
        if missing:
            raise BundleError(f"the drafter reads layer {missing[0]}, and the bundle's target graph has no "
                              f"hidden-state output of it (convert the target with the drafter)")
        return np.concatenate([np.arange(h) + self._taps.layers.index(layer) * h for layer in layers])

    def features(self, lo: int, hi: int, columns: np.ndarray) -> np.ndarray:
        """Taps of cache slots lo..hi-1 at these columns [hi - lo, len(columns)] (a copy)."""
        return self._taps.rows[lo:hi][:, columns]


class Drafter:
    """Base of every drafter: the declared capabilities with their defaults (see the module docstring)."""

    name: str = "drafter"
    reads_hidden_states: bool = False
    block_drafter: bool = False
    max_draft: int | None = None
    catchup_seconds: float = 0.0

    @classmethod
    def from_bundle(cls, bundle_dir, entry, manifest, providers, threads: int = 0) -> "Drafter":
        """The drafter for a bundle: `entry` is its manifest entry (specrt.drafter_entry.DrafterEntry; None for
        kinds that need no graph), `manifest` the bundle's. The registry (specrt/drafter_kinds.py) calls this."""
        return cls()

    @property
    def members(self) -> list["Drafter"]:
        return [self]

    def bind(self, target: TargetView) -> None:
        """Called before the first proposal when reads_hidden_states."""

    def use_costs(self, seconds) -> None:
        """seconds(fed): the measured cost of a target call feeding `fed` tokens; None: a fixed draft length."""

    def backlog(self, context: list[int]) -> int:
        """Context tokens (prompt + output, ending with the pending token) it has not read yet."""
        return 0

    def prefill(self, prompt: list[int]) -> None:
        """Read the prompt (all of it is in the target's cache when this is called)."""

    def reset(self, params=None, rng=None) -> None:
        """Start a generation with these SamplingParams and random generator (drafters that sample use both)."""

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        """A draft continuing `context` (prompt + output, ending with the pending token), or None."""
        raise NotImplementedError

    def remember(self, tokens: list[int]) -> None:
        """A generation ended: its prompt and output (drafters that learn across requests keep them)."""
