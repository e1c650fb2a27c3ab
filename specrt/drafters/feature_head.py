"""Drafting with a head that reads the target's hidden states (EAGLE-3, MTP): chain and EAGLE-2 dynamic tree.

Head position t pairs the target's features f_t (read through the TargetView the loop binds it to) with the next
token x_{t+1}, at position t, and predicts x_{t+2}. For a context x_0..x_n (x_n the pending token, not yet
seen by the target) the head catches up on the positions it has not read with true features (up to t = n - 1,
whose row predicts the first draft token), then drafts on: each further step feeds a draft token with the
head's own hidden output instead of target features. Its cache keeps only the true-feature positions between
proposals (the draft steps are rolled back), so a rejected draft costs nothing to undo. Draft ids map to
target ids by d + d2t[d] (identity when the head predicts the whole target vocabulary).

Tree (topk > 1, Li et al. 2024, "EAGLE-2"): the first step's top-k tokens are the depth-1 nodes, scored by
their log-probability under the head. Each further step runs the k best-scoring nodes of the newest depth in
one head call (an attention bias lets each see the prefix, its ancestors and itself) and gives each its
top-k children, scored by the sum of log-probabilities along the path. The draft is the `max_tokens` best
nodes of the whole tree (a child never outscores its parent, so the set keeps every node's ancestors).
Tree nodes are chosen deterministically, so they go to the verifier without draft probabilities, which keeps
sampled verification lossless; a chain at temperature > 0 samples from the head and passes its q.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.drafter_entry import DrafterEntry
from specrt.drafters.draft_vocab import load_draft_targets, to_target_vocab
from specrt.runtime.drafter import Draft, Drafter, TargetView, common_prefix
from specrt.runtime.sampling import SamplingParams, target_probs
from specrt.runtime.target_session import TargetSession, TargetSpec


@dataclass
class _Node:
    token: int  # target id
    draft_id: int
    parent: int  # index into the node list, -1: child of the pending token
    depth: int  # 1 for children of the pending token
    score: float  # sum of the head's log-probabilities along the path
    hidden_in: np.ndarray  # [H] what the head reads with this token when it expands the node
    slot: int = -1  # head cache slot once fed


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = float(x.max())
    return (x - m) - np.log(np.exp(x - m, dtype=np.float64).sum())


class FeatureHeadDrafter(Drafter):
    name = "feature-head"
    reads_hidden_states = True

    def __init__(self, bundle_dir: Path, entry: DrafterEntry, target_vocab: int, providers, threads: int = 0,
                 topk: int = 1, max_depth: int = 3):
        kv, vocab = entry.kv, entry.draft_vocab_size
        spec = TargetSpec(1, kv.kv_heads, kv.head_dim, kv.max_context, vocab, extra_outputs=("hidden_out",),
                          kv_dtype=kv.dtype)
        self.session = TargetSession(Path(bundle_dir) / entry.graph.file, spec, providers, threads=threads)
        targets = load_draft_targets(bundle_dir, entry, target_vocab, vocab)
        self.d2t_targets = np.arange(vocab) if targets is None else targets  # [V_head] target id of each head id
        self.aux_layers = entry.aux_layers
        self.columns: np.ndarray | None = None  # columns of the target's taps holding the head's layers, in its order
        self.hidden_size, self.target_vocab = entry.graph.hidden_size, target_vocab
        self.width = len(self.aux_layers) * entry.target_hidden_size
        self.topk, self.max_depth = topk, max_depth
        self.max_draft: int | None = None  # draft tokens per call the engine may ask for (None: the engine's own)
        self.tokens: list[int] = []  # x_{t+1} fed at head position t with true features
        self.target: TargetView | None = None
        self.params, self.rng = SamplingParams(temperature=0.0), np.random.default_rng()

    @classmethod
    def from_bundle(cls, bundle_dir, entry, manifest, providers, threads: int = 0) -> "FeatureHeadDrafter":
        return cls(bundle_dir, entry, manifest.vocab_size, providers, threads=threads)

    def use_tree(self, topk: int = 3, max_depth: int = 3, max_draft: int = 6) -> None:
        """Draft EAGLE-2 dynamic trees: topk children per node, up to max_depth deep, up to max_draft nodes."""
        self.topk, self.max_depth, self.max_draft = topk, max_depth, max_draft

    def bind(self, target: TargetView) -> None:
        self.target, self.columns = target, target.columns(self.aux_layers)

    def reset(self, params: SamplingParams | None = None, rng: np.random.Generator | None = None) -> None:
        self.params = params or SamplingParams(temperature=0.0)
        self.rng = rng if rng is not None else np.random.default_rng()

    def _run(self, tokens: list[int], features: np.ndarray | None, hidden: np.ndarray | None,
             positions: np.ndarray | None = None, bias: np.ndarray | None = None):
        """Feed tokens [S] -> logits [S, V_head], hidden_out [S, H]."""
        n = len(tokens)
        dtype = self.session.np_dtype  # the head's activations: float16 in a GPU bundle
        extra = {
            "features": features[None].astype(dtype) if features is not None else np.zeros((1, n, self.width), dtype),
            "hidden": hidden[None].astype(dtype) if hidden is not None else np.zeros((1, n, self.hidden_size), dtype),
            "use_features": np.array([features is not None]),
        }
        logits, hidden_out = self.session.forward(np.array([tokens], dtype=np.int64), position_ids=positions,
                                                  attention_bias=bias, extra_inputs=extra)
        return logits[0], hidden_out[0]

    def _pick(self, head_logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        """A target token id from the head's logits (and its distribution over the target vocabulary)."""
        if self.params.greedy:
            return int(self.d2t_targets[int(np.argmax(head_logits))]), None
        q = target_probs(to_target_vocab(head_logits, self.d2t_targets, self.target_vocab), self.params)
        return int(self.rng.choice(len(q), p=q)), q

    def backlog(self, context: list[int]) -> int:
        n = len(context) - 1
        return n - common_prefix(self.tokens, context[1:n + 1])

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        n = len(context) - 1  # the target has read context[:n]: features f_0 .. f_{n-1} exist
        room = self.session.spec.max_context - n
        k = min(max_tokens, room)
        if self.target is None or n < 1 or k < 1:
            return None
        want = context[1:n + 1]  # head position t reads x_{t+1}
        keep = min(common_prefix(self.tokens, want), n - 1)
        self.session.rollback(keep)
        feats = self.target.features(keep, n, self.columns)  # [n - keep, F]
        logits, hidden = self._run(want[keep:], feats, None)
        self.tokens = list(want)
        if self.topk > 1 and k > 1:
            return self._tree(logits[-1], hidden[-1], n, k)
        return self._chain(logits[-1], hidden[-1:], k)

    def _chain(self, logits: np.ndarray, hidden: np.ndarray, k: int) -> Draft:
        tokens, probs = [], []
        for i in range(k):
            token, q = self._pick(logits)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if i + 1 < k:
                logits, hidden = self._run([token], None, hidden)
                logits, hidden = logits[-1], hidden[-1:]
        return Draft.chain(tokens, np.stack(probs) if probs else None)

    def _children(self, logits: np.ndarray, parent: int, depth: int, base: float, hidden_in: np.ndarray) -> list[_Node]:
        k = min(self.topk, len(logits))
        best = np.argpartition(-logits, k - 1)[:k]
        best = best[np.argsort(-logits[best], kind="stable")]
        logp = _log_softmax(logits)[best]
        return [_Node(int(self.d2t_targets[d]), int(d), parent, depth, base + float(lp), hidden_in)
                for d, lp in zip(best, logp)]

    def _tree(self, logits: np.ndarray, hidden: np.ndarray, n: int, budget: int) -> Draft:
        nodes = self._children(logits, -1, 1, 0.0, hidden)
        newest = list(range(len(nodes)))
        for depth in range(2, min(self.max_depth, budget) + 1):
            expand = sorted(newest, key=lambda i: -nodes[i].score)[:self.topk]
            room = self.session.spec.max_context - self.session.length
            if len(expand) > room:
                break
            past = self.session.length
            for j, i in enumerate(expand):
                nodes[i].slot = past + j
            bias = np.full((1, 1, len(expand), past + len(expand)), -np.inf, dtype=np.float32)
            bias[..., :n] = 0.0  # the true-feature prefix
            for j, i in enumerate(expand):
                a = i
                while a >= 0:  # itself and its fed ancestors
                    bias[0, 0, j, nodes[a].slot] = 0.0
                    a = nodes[a].parent
            positions = np.array([[n + depth - 2] * len(expand)], dtype=np.int64)
            out_logits, out_hidden = self._run([nodes[i].token for i in expand], None,
                                               np.stack([nodes[i].hidden_in for i in expand]), positions, bias)
            newest = []
            for j, i in enumerate(expand):
                children = self._children(out_logits[j], i, depth, nodes[i].score, out_hidden[j])
                newest += range(len(nodes), len(nodes) + len(children))
                nodes += children
        # the budget's best nodes (ties: shallower first, so a parent precedes its equal-scored child)
        chosen = sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth, i))[:budget]
        chosen.sort(key=lambda i: (nodes[i].depth, i))
        index = {i: j for j, i in enumerate(chosen)}
        parents = [index[nodes[i].parent] if nodes[i].parent >= 0 else -1 for i in chosen]
        return Draft(np.array([nodes[i].token for i in chosen], dtype=np.int64), np.array(parents, dtype=np.int64))
