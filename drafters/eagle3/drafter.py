"""EAGLE-3 chain drafting (Li et al. 2025) over the graph convert/eagle3_graph.py writes.

Head position t pairs the target's hidden-state features f_t (its three aux layers, read from the engine's
per-slot feature buffer) with the next token x_{t+1}, at position t, and predicts x_{t+2}. For a context
x_0..x_n (x_n the pending token, not yet seen by the target) the head catches up on the positions it has not
read with true features (up to t = n - 1, whose row predicts the first draft token), then drafts on: each
further step feeds the previous draft token with the head's own pre-norm hidden output instead of target
features. Its cache keeps only the true-feature positions between proposals (the draft steps are rolled
back), so a rejected draft costs nothing to undo. Draft ids map to target ids by d + d2t[d].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.drafters.base import Draft
from specrt.runtime.sampling import SamplingParams, target_probs
from specrt.runtime.engine import common_prefix
from specrt.runtime.target_session import TargetSession, TargetSpec


class Eagle3Drafter:
    name = "eagle3"

    def __init__(self, bundle_dir: Path, entry: dict, target_hidden_layers: tuple[int, ...], target_vocab: int,
                 providers, threads: int = 0):
        from safetensors.numpy import load_file

        kv, graph = entry["kv"], entry["graph"]
        spec = TargetSpec(1, kv["kv_heads"], kv["head_dim"], kv["max_context"], entry["draft_vocab_size"],
                          extra_outputs=("hidden_out",))
        self.session = TargetSession(Path(bundle_dir) / graph["file"], spec, providers, threads=threads)
        self.d2t_targets = np.arange(entry["draft_vocab_size"]) + load_file(
            str(Path(bundle_dir) / entry["extra_files"][0]))["d2t"].astype(np.int64)  # [V_draft] target ids
        h = entry["target_hidden_size"]
        # columns of the engine's feature buffer holding the head's aux layers, in the head's order
        self.columns = np.concatenate([np.arange(h) + target_hidden_layers.index(layer) * h for layer in entry["aux_layers"]])
        self.hidden_size, self.width, self.target_vocab = graph["hidden_size"], 3 * h, target_vocab
        self.tokens: list[int] = []  # x_{t+1} fed at head position t with true features
        self.engine = None
        self.params, self.rng = SamplingParams(temperature=0.0), np.random.default_rng()

    def attach(self, engine) -> None:
        self.engine = engine

    def reset(self, params: SamplingParams | None = None, rng: np.random.Generator | None = None) -> None:
        self.params = params or SamplingParams(temperature=0.0)
        self.rng = rng if rng is not None else np.random.default_rng()

    def _run(self, tokens: list[int], features: np.ndarray | None, hidden: np.ndarray | None):
        n = len(tokens)
        extra = {
            "features": features[None] if features is not None else np.zeros((1, n, self.width), np.float32),
            "hidden": hidden[None] if hidden is not None else np.zeros((1, n, self.hidden_size), np.float32),
            "use_features": np.array([features is not None]),
        }
        logits, hidden_out = self.session.forward(np.array([tokens], dtype=np.int64), extra_inputs=extra)
        return logits[0, -1], hidden_out[0, -1:]  # [V_draft], [1, H]

    def _pick(self, draft_logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        """A target token id from the head's logits (and its distribution over the target vocabulary)."""
        if self.params.greedy:
            return int(self.d2t_targets[int(np.argmax(draft_logits))]), None
        full = np.full(self.target_vocab, -np.inf, dtype=np.float32)
        full[self.d2t_targets] = draft_logits
        q = target_probs(full, self.params)
        return int(self.rng.choice(len(q), p=q)), q

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        n = len(context) - 1  # the target has read context[:n]: features f_0 .. f_{n-1} exist
        room = self.session.spec.max_context - n
        k = min(max_tokens, room)
        if self.engine is None or n < 1 or k < 1:
            return None
        want = context[1:n + 1]  # head position t reads x_{t+1}
        keep = min(common_prefix(self.tokens, want), n - 1)
        self.session.rollback(keep)
        feats = self.engine.features[keep:n][:, self.columns]  # [n - keep, 3H]
        logits, hidden = self._run(want[keep:], feats, None)
        self.tokens = list(want)
        tokens, probs = [], []
        for i in range(k):
            token, q = self._pick(logits)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if i + 1 < k:
                logits, hidden = self._run([token], None, hidden)
        return Draft.chain(tokens, np.stack(probs) if probs else None)
