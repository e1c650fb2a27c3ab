"""Draft-model drafting (Leviathan et al. 2023; Chen et al. 2023): a small LM proposes a chain.

The draft model keeps its own preallocated KV cache (a TargetSession over `draft.onnx`) and a list of the
token ids the cache holds. Each `propose(context, k)` rolls the cache back to the longest common prefix
with the context (the target rejected whatever lies beyond it), feeds the rest of the context, then feeds
its own tokens one by one: k draft tokens cost k calls, the last draft token is never fed. Greedy drafting
at temperature 0; at temperature > 0 it samples from its own distribution under the same temperature,
top-k and top-p and hands that distribution q to the verifier for rejection sampling.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from specrt.bundle import parse_states
from specrt.drafter_entry import DrafterEntry
from specrt.drafters.draft_vocab import load_draft_targets, to_target_vocab
from specrt.runtime.drafter import Draft, Drafter, common_prefix, draft_chain
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.target_session import TargetSession, TargetSpec

PREFILL_CHUNK = 256


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, bundle_dir: Path, entry: DrafterEntry, target_vocab: int, providers, threads: int = 0):
        kv = entry.kv
        window = entry.model_config.get("sliding_window") or 0
        layer_ids = tuple(entry.raw["kv"].get("layer_ids", ()))  # a hybrid draft model: its attention layers
        spec = TargetSpec(kv.layers, kv.kv_heads, kv.head_dim, kv.max_context, entry.vocab_size, kv_dtype=kv.dtype,
                          sliding_window=window if "sliding_attention_bias" in entry.graph.inputs else 0,
                          kv_layers=layer_ids, states=parse_states(entry.raw.get("states")),
                          kv_shapes=tuple(tuple(s) for s in entry.raw["kv"].get("layer_shapes", ())))
        self.session = TargetSession(Path(bundle_dir) / entry.graph.file, spec, providers, threads=threads)
        self.target_vocab = target_vocab
        # [V_draft] target id of each output of a head cut to a draft vocabulary (None: the whole vocabulary)
        self.targets = load_draft_targets(bundle_dir, entry, target_vocab, draft_vocab=entry.vocab_size)
        self.cached: list[int] = []  # token ids whose KV the draft cache holds
        self.params = SamplingParams(temperature=0.0)
        self.rng = np.random.default_rng()
        self.catchup_seconds = 0.0  # of the last propose: feeding context the draft cache had not seen

    @classmethod
    def from_bundle(cls, bundle_dir, entry, manifest, providers, threads: int = 0) -> "DraftModelDrafter":
        return cls(bundle_dir, entry, manifest.vocab_size, providers, threads=threads)

    def reset(self, params: SamplingParams | None = None, rng: np.random.Generator | None = None) -> None:
        self.params = params or SamplingParams(temperature=0.0)
        self.rng = rng if rng is not None else np.random.default_rng()

    def _feed(self, tokens: list[int]) -> np.ndarray:
        """Feed tokens after the cache; returns the last token's logits over the target vocabulary [V_target]."""
        for lo in range(0, len(tokens), PREFILL_CHUNK):
            logits = self.session.forward(np.array([tokens[lo:lo + PREFILL_CHUNK]], dtype=np.int64))[0, -1]
        self.cached.extend(tokens)
        if self.targets is not None:
            return to_target_vocab(logits, self.targets, self.target_vocab)
        if len(logits) == self.target_vocab:
            return logits
        out = np.full(self.target_vocab, -np.inf, dtype=np.float32)  # a token the target lacks is never drafted
        n = min(len(logits), self.target_vocab)
        out[:n] = logits[:n]
        return out

    def _rewind(self, context: list[int]) -> int:
        """Roll the draft cache back to its longest common prefix with context (keeping at least one token
        of context to feed); returns how many tokens it keeps."""
        keep = min(common_prefix(self.cached, context), len(context) - 1)
        keep = self.session.reachable(keep)  # a recurrent draft model: its snapshot of the verified context
        self.session.rollback(keep)
        del self.cached[keep:]
        return keep

    def prefill(self, prompt: list[int]) -> None:
        """Bring the draft cache to hold the prompt (all but its last token, which the first propose feeds)."""
        if len(prompt) < 2 or len(prompt) > self.session.spec.max_context:
            return
        keep = self._rewind(prompt)
        if len(prompt) - 1 > keep:
            self._feed(prompt[keep:-1])

    def backlog(self, context: list[int]) -> int:
        return len(context) - common_prefix(self.cached, context)

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        room = self.session.spec.max_context - len(context)
        k = min(max_tokens, room)
        if k < 1:
            return None  # past the draft model's context: the loop decodes plainly
        keep = self._rewind(context)
        t0 = time.perf_counter()
        logits = self._feed(context[keep:])
        if self.session.recurrent:  # the context is all verified: the next propose (whose context extends this
            self.session.snapshot()  # one) restarts at most from here, whatever the target rejects
        # steady state feeds 1-2 tokens (pending, maybe the bonus); more is catching up after a prompt or a
        # stretch of plain decoding, which the adaptive controller must not count as the cost of drafting
        self.catchup_seconds = time.perf_counter() - t0 if len(context) - keep > 2 else 0.0
        return draft_chain(logits, k, self.params, self.rng, lambda token: self._feed([token]))
