"""CPU twin of the fused verification kernel (kernels/verify.py): same signature, numpy, no torch.

Verifies a batch of drafts (each a tree; a chain is the tree with parents i - 1) against the target's
logits, losslessly:
- temperature 0 (per request): a draft token is accepted iff it is the argmax of its parent's row (first
  index on ties, like np.argmax); the next token is that argmax.
- temperature > 0: the target distribution p of a row is temperature, then top-k (keep logits >= the k-th
  largest), then softmax, then top-p (keep a token iff the mass of tokens strictly more likely is < top_p).
  Children of a node are tried in index order: child c with token x is accepted iff u[c] < p[x] / q_c[x]
  (q_c the draft distribution, one-hot without one); a rejection replaces p by normalize(max(p - q_c, 0))
  (unchanged if that is all zero): the multi-draft recursive form (SpecInfer), exact for one-hot drafts
  and for siblings drawn i.i.d. from q. After a rejection of all children the recovered token, or after a
  leaf the bonus token, is drawn from p by the exponential race argmax(p / e) with e ~ Exp(1) given.

Random numbers come in as arguments (uniforms [B, K], exp_noise [B, V]) so that the Triton kernel and
this twin give the same tokens for the same inputs.
"""

from __future__ import annotations

import numpy as np


def row_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """logits [V] -> the target distribution [V] (float64) under temperature > 0, top-k, top-p."""
    x = logits.astype(np.float64) / temperature
    if 0 < top_k < x.shape[-1]:
        kth = np.partition(x, -top_k)[-top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        sorted_p = p[order]
        before = np.cumsum(sorted_p) - sorted_p  # mass of the tokens ranked ahead
        # tie-inclusive: a token is kept iff the tokens strictly more likely than it hold < top_p
        strictly_ahead = before[np.searchsorted(-sorted_p, -sorted_p, side="left")]
        keep = np.zeros_like(p, dtype=bool)
        keep[order] = strictly_ahead < top_p
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


def _race(p: np.ndarray, noise: np.ndarray) -> int:
    """Exponential race: argmax p / e over tokens with p > 0 (a draw from p normalized)."""
    score = np.where(p > 0, p / noise, -1.0)
    return int(np.argmax(score))


def _verify_one(logits, tokens, parents, n, probs, temperature, top_k, top_p, uniforms, noise):
    children: dict[int, list[int]] = {}
    for c in range(n):
        children.setdefault(int(parents[c]), []).append(c)
    accepted: list[int] = []
    node, row = -1, 0
    while True:
        kids = children.get(node, [])
        if temperature == 0:
            choice = int(np.argmax(logits[row]))
            match = next((c for c in kids if int(tokens[c]) == choice), None)
            if match is None:
                return accepted, choice
        else:
            p = row_probs(logits[row], temperature, top_k, top_p)
            match = None
            for c in kids:
                x = int(tokens[c])
                q = probs[c].astype(np.float64) if probs is not None else None
                qx = q[x] if q is not None else 1.0
                if qx > 0 and uniforms[c] < p[x] / qx:
                    match = c
                    break
                if q is None:
                    q = np.zeros_like(p)
                    q[x] = 1.0
                residual = np.maximum(p - q, 0.0)
                total = residual.sum()
                if total > 0:
                    p = residual / total
            if match is None:
                return accepted, _race(p, noise)
        accepted.append(match)
        node, row = match, match + 1


def verify_tree_ref(logits, tokens, parents, num_draft, draft_probs, temperature, top_k, top_p, uniforms, exp_noise):
    """Batch verification (numpy).

    logits [B, K + 1, V]: row 0 after the pending token, row i + 1 after draft token i
    tokens, parents [B, K] int (parents[b, i] < i, -1 under the pending token); num_draft [B]: drafts may be shorter
    draft_probs [B, K, V] or None (one-hot); temperature, top_p [B] float; top_k [B] int (0: off)
    uniforms [B, K] in [0, 1); exp_noise [B, V] > 0 (Exp(1) draws)
    Returns accepted [B, K] (draft indices root to leaf, -1 padded), num_accepted [B], next_token [B].
    """
    b, k = tokens.shape
    accepted = np.full((b, k), -1, dtype=np.int64)
    count = np.zeros(b, dtype=np.int64)
    next_token = np.zeros(b, dtype=np.int64)
    for i in range(b):
        path, nxt = _verify_one(logits[i], tokens[i], parents[i], int(num_draft[i]),
                                None if draft_probs is None else draft_probs[i], float(temperature[i]),
                                int(top_k[i]), float(top_p[i]), uniforms[i], exp_noise[i])
        accepted[i, :len(path)] = path
        count[i], next_token[i] = len(path), nxt
    return accepted, count, next_token
