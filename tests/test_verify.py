"""The verifier, table-driven (greedy) and by distribution (sampling, chi-square)."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime.drafter import Draft
from specrt.runtime.sampling import SamplingParams, target_probs
from specrt.runtime.verify import verify

V = 6
GREEDY = SamplingParams(temperature=0.0)


def peaked(*tokens) -> np.ndarray:
    """logits [len(tokens), V] whose argmax per row is the given token."""
    out = np.zeros((len(tokens), V), dtype=np.float32)
    for i, t in enumerate(tokens):
        out[i, t] = 5.0
    return out


# target's greedy path after the pending token: 1, 2, 3, 4 (then 5)
CASES = [
    ("all accepted -> bonus", [1, 2, 3, 4], [0, 1, 2, 3], 5, True),
    ("none accepted -> recovered", [0, 2, 3, 4], [], 1, False),
    ("mismatch at 2", [1, 0, 3, 4], [0], 2, False),
    ("mismatch at 3", [1, 2, 0, 4], [0, 1], 3, False),
    ("mismatch at 4", [1, 2, 3, 0], [0, 1, 2], 4, False),
]


@pytest.mark.parametrize("name, drafted, accepted, next_token, bonus", CASES, ids=[c[0] for c in CASES])
def test_greedy_chain(name, drafted, accepted, next_token, bonus):
    v = verify(Draft.chain(drafted), peaked(1, 2, 3, 4, 5), GREEDY, np.random.default_rng(0))
    assert (v.accepted, v.next_token, v.bonus) == (accepted, next_token, bonus)


def test_greedy_tie_follows_plain_argmax():
    logits = np.zeros((2, V), dtype=np.float32)
    logits[0, [2, 4]] = 3.0  # tie: plain greedy (np.argmax) picks 2
    assert verify(Draft.chain([4]), logits, GREEDY, np.random.default_rng(0)).accepted == []
    assert verify(Draft.chain([2]), logits, GREEDY, np.random.default_rng(0)).accepted == [0]


def test_greedy_tree_with_several_branches():
    # pending -> {0: tok 3, 1: tok 1}; 1 -> {2: tok 0, 3: tok 2}; 3 -> {4: tok 5}
    draft = Draft(np.array([3, 1, 0, 2, 5]), np.array([-1, -1, 1, 1, 3]))
    logits = np.zeros((6, V), dtype=np.float32)
    logits[0, 1] = logits[2, 2] = logits[4, 5] = logits[5, 4] = 5.0  # target path 1 -> 2 -> 5, then 4
    v = verify(draft, logits, GREEDY, np.random.default_rng(0))
    assert (v.accepted, v.next_token, v.bonus) == ([1, 3, 4], 4, True)
    logits[4] = 0
    logits[4, 3] = 5.0  # after token 2 the target wants 3, which no child drafted
    v = verify(draft, logits, GREEDY, np.random.default_rng(0))
    assert (v.accepted, v.next_token, v.bonus) == ([1, 3], 3, False)


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    from scipy.stats import chisquare

    keep = probs > 0
    assert counts[~keep].sum() == 0  # never a token the target excludes (top-p)
    expected = probs[keep] * counts.sum()
    return chisquare(counts[keep], expected).pvalue


def sample_two_tokens(l1, l2, q1, q2, shape: str, params: SamplingParams, rng, n: int = 20000) -> np.ndarray:
    """counts [V, V] of the first two tokens that speculative sampling outputs, with target logits l1 [V] after
    the pending token and l2 [V, V] after each first token, draft distributions q1 [V] and q2 [V, V]."""
    v = len(l1)
    counts = np.zeros((v, v))
    for _ in range(n):
        if shape == "chain":
            d1 = rng.choice(v, p=q1)
            d2 = rng.choice(v, p=q2[d1])
            draft = Draft.chain([d1, d2], probs=np.stack([q1, q2[d1]]))
            logits = np.stack([l1, l2[d1], np.zeros(v)])
        else:  # two i.i.d. children of the pending token, the first with one child of its own
            a, b = rng.choice(v, p=q1), rng.choice(v, p=q1)
            c = rng.choice(v, p=q2[a])
            draft = Draft(np.array([a, b, c]), np.array([-1, -1, 0]), probs=np.stack([q1, q1, q2[a]]))
            logits = np.stack([l1, l2[a], l2[b], np.zeros(v)])
        verdict = verify(draft, logits, params, rng)
        out = [int(draft.tokens[i]) for i in verdict.accepted] + [verdict.next_token]
        if len(out) < 2:  # x1 was recovered: draw x2 from the target as the next step would
            out.append(int(rng.choice(v, p=target_probs(l2[out[0]], params))))
        counts[out[0], out[1]] += 1
    return counts


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_sampling_matches_the_target_distribution(shape):
    """First two output tokens of speculative sampling ~ target's p(x1) p(x2 | x1), temperature 1, top-p 0.9."""
    rng = np.random.default_rng(123)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    l1 = rng.normal(size=V) * 1.5  # target logits after the pending token
    l2 = rng.normal(size=(V, V)) * 1.5  # target logits after token x1
    q1 = np.exp(rng.normal(size=V))
    q1 /= q1.sum()  # draft distribution (different from the target's)
    q2 = np.exp(rng.normal(size=(V, V)))
    q2 /= q2.sum(1, keepdims=True)
    p1 = target_probs(l1, params)
    joint = p1[:, None] * np.stack([target_probs(l2[x], params) for x in range(V)])
    counts = sample_two_tokens(l1, l2, q1, q2, shape, params, rng)
    assert _chi_square_p(counts.reshape(-1), joint.reshape(-1)) > 0.01
