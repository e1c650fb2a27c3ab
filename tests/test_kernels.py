"""Triton kernels against their numpy twins on random inputs (TRITON_INTERPRET=1 on the CPU, natively on a
GPU with SPECRT_TEST_GPU=1): fused verification (chain and tree, greedy and sampling, batch > 1 with
different draft lengths, vocabularies that are not a multiple of the block) and KV path compaction."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.kernels.kv_compact import kv_compact_ref
from specrt.kernels.verify_ref import row_probs, verify_tree_ref

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from specrt.kernels.kv_compact import kv_compact_triton  # noqa: E402
from specrt.kernels.verify import BLOCK, target_probs_triton, verify_tree, verify_tree_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _random_batch(rng, b, k, v, lengths, shape, temperature, top_k, top_p, with_probs, hit_rate=0.7):
    """Random logits and drafts; each draft token is its parent's argmax with probability hit_rate."""
    logits = (rng.normal(size=(b, k + 1, v)) * 2).astype(np.float32)
    tokens = np.zeros((b, k), dtype=np.int64)
    parents = np.tile(np.arange(k) - 1, (b, 1))
    for i in range(b):
        for c in range(lengths[i]):
            if shape == "tree" and c > 0:
                parents[i, c] = rng.integers(-1, c)  # any earlier node (or the root)
            row = parents[i, c] + 1
            tokens[i, c] = np.argmax(logits[i, row]) if rng.random() < hit_rate else rng.integers(v)
    probs = None
    if with_probs:
        q = np.exp(rng.normal(size=(b, k, v)) * 2)
        probs = (q / q.sum(-1, keepdims=True)).astype(np.float32)
        for i in range(b):  # make the drafted tokens likely under q, as a real drafter's would be
            for c in range(k):
                probs[i, c, tokens[i, c]] += 0.5
        probs /= probs.sum(-1, keepdims=True)
    args = (logits, tokens, parents, np.array(lengths, dtype=np.int64), probs,
            np.array(temperature, dtype=np.float32), np.array(top_k, dtype=np.int64), np.array(top_p, dtype=np.float32),
            rng.random((b, k)).astype(np.float32), rng.exponential(size=(b, v)).astype(np.float32) + 1e-6)
    return args


def _torch(args):
    return [None if a is None else torch.from_numpy(a).to(DEVICE) for a in args]


def _check_same(args):
    ref = verify_tree_ref(*args)
    got = [t.cpu().numpy() for t in verify_tree_triton(*_torch(args))]
    for name, r, g in zip(("accepted", "num_accepted", "next_token"), ref, got):
        np.testing.assert_array_equal(g, r, err_msg=name)
    return ref


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("v", [1000, BLOCK + 357])  # one partial block; a full block plus a partial one
def test_greedy_matches_twin(shape, v):
    rng = np.random.default_rng(v + len(shape))
    for trial in range(3):
        lengths = [5, 3, 0, 1]  # batch > 1 with different draft lengths, one request without a draft
        args = _random_batch(rng, 4, 5, v, lengths, shape, [0.0] * 4, [0] * 4, [1.0] * 4, with_probs=False)
        accepted, count, _ = _check_same(args)
        assert count[2] == 0 and (count <= np.array(lengths)).all()


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("with_probs", [False, True])
def test_sampling_matches_twin(shape, with_probs):
    rng = np.random.default_rng(7 + with_probs + 2 * (shape == "tree"))
    v = 700  # not a multiple of the block
    counts = []
    for trial in range(4):
        lengths = [4, 2, 4, 3]
        # per request: plain temperature, top-k, top-p, and one greedy request in the same batch
        args = _random_batch(rng, 4, 4, v, lengths, shape, [0.8, 1.0, 1.3, 0.0], [0, 20, 0, 0],
                             [1.0, 1.0, 0.9, 1.0], with_probs, hit_rate=0.8)
        counts.append(_check_same(args)[1])
    assert np.concatenate(counts).max() > 0  # some drafts were accepted: the accept branch ran


def test_all_accepted_chain_gives_bonus_and_full_count():
    rng = np.random.default_rng(1)
    args = _random_batch(rng, 2, 4, 300, [4, 4], "chain", [0.0, 0.0], [0, 0], [1.0, 1.0], False, hit_rate=1.0)
    accepted, count, next_token = _check_same(args)
    assert count.tolist() == [4, 4] and accepted[0].tolist() == [0, 1, 2, 3]
    assert next_token[0] == np.argmax(args[0][0, 4])  # the bonus token: argmax after the last draft token


def test_kernel_target_distribution_equals_twin():
    """The rows the kernel samples from: temperature, top-k (ties kept), softmax, top-p, as in the twin."""
    rng = np.random.default_rng(3)
    v = BLOCK + 211
    logits = (rng.normal(size=(6, v)) * 2).astype(np.float32)
    logits[5, :40] = logits[5].max() + 1.0  # a tie across the top-k boundary: all 40 tied tokens stay
    temperature = np.array([1.0, 0.7, 1.5, 1.0, 0.9, 1.0], np.float32)
    top_k = np.array([0, 50, 0, 0, 40, 10])
    top_p = np.array([1.0, 1.0, 0.9, 0.5, 0.85, 1.0], np.float32)
    got = target_probs_triton(*_torch((logits, temperature, top_k, top_p))).cpu().numpy()
    for r in range(6):
        want = row_probs(logits[r], float(temperature[r]), int(top_k[r]), float(top_p[r]))
        np.testing.assert_array_equal(got[r] > 0, want > 0, err_msg=f"row {r}: kept set")
        np.testing.assert_allclose(got[r], want, atol=2e-6, err_msg=f"row {r}")
    assert (got[5] > 0).sum() == 40 and (got[1] > 0).sum() == 50


def test_dispatch_uses_the_twin_for_numpy():
    rng = np.random.default_rng(5)
    args = _random_batch(rng, 2, 3, 50, [3, 2], "chain", [0.0, 1.0], [0, 0], [1.0, 1.0], False)
    for r, g in zip(verify_tree_ref(*args), verify_tree(*args)):
        np.testing.assert_array_equal(r, g)


@pytest.mark.parametrize("d", [64, 70])
def test_kv_compact_matches_twin(d):
    rng = np.random.default_rng(d)
    buf = rng.normal(size=(2, 3, 40, d)).astype(np.float32)
    for dst, src in ((10, [10, 12, 13, 17]), (5, [7, 8, 9]), (20, [20, 21])):
        ref = buf.copy()
        kv_compact_ref(ref, dst, np.array(src))
        t = torch.from_numpy(buf.copy()).to(DEVICE)
        kv_compact_triton(t, dst, torch.tensor(src, dtype=torch.int64, device=DEVICE))
        np.testing.assert_array_equal(t.cpu().numpy(), ref)
        np.testing.assert_array_equal(ref[:, :, dst + 1], buf[:, :, src[1]])  # the twin moved what it should


@pytest.mark.parametrize("hv, hk, dv, dk", [(4, 2, 3, 5), (8, 8, 40, 16)])  # grouped heads; Dv over one block
def test_state_replay_matches_twin(hv, hk, dv, dk):
    """The recurrent state replayed over every accepted prefix of a call: the kernel equals the numpy twin."""
    from specrt.kernels.state_replay import replay_recurrent_ref, replay_recurrent_triton

    capacity, rng = 8, np.random.default_rng(hv + dv)
    before = rng.standard_normal((2, hv, dv, dk)).astype(np.float32)
    capture = rng.standard_normal((2, capacity * (hv + hk * dk + hv * dv))).astype(np.float32)
    capture[:, :capacity * hv] = rng.uniform(0.5, 1.0, (2, capacity * hv))  # decays in (0, 1]
    for kept in (0, 1, 3, capacity):
        want = np.empty_like(before)
        replay_recurrent_ref(before, capture, kept, capacity, hk, want)
        got = torch.empty(before.shape, dtype=torch.float32, device=DEVICE)
        replay_recurrent_triton(torch.from_numpy(before).to(DEVICE), torch.from_numpy(capture).to(DEVICE), kept,
                                capacity, hk, got)
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-6, atol=1e-6)
        if kept == 0:
            np.testing.assert_array_equal(want, before)
