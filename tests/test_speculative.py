"""The draft-verify loop on a tiny bundle: greedy output equals plain decoding for every drafter shape."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime.drafter import Draft
from specrt.drafters.ngram import NgramDrafter
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.speculative import tree_bias
from tests.oracle_drafters import OracleDrafter
from tests.test_runtime import engine  # noqa: F401  (module fixture: a converted tiny bundle)

PARAMS = SamplingParams(max_new_tokens=40, stop_token_ids=())
PROMPTS = ("the cat and the dog", "a man in the house of the world", "the world the world the world")


def test_ngram_finds_the_latest_match():
    d = NgramDrafter(max_n=2).propose([5, 6, 7, 8, 1, 5, 6, 9, 5, 6], 3)
    assert d.tokens.tolist() == [9, 5, 6] and d.is_chain()
    assert NgramDrafter().propose([1, 2, 3], 3) is None


def test_ngram_history_drafts_from_earlier_generations():
    d = NgramDrafter()
    d.use_mode("history")
    assert d.propose([1, 2, 3, 40, 41, 42, 43, 44], 3) is None  # nothing repeats yet
    d.remember([1, 2, 3, 40, 41, 42, 43, 44])  # a finished generation joins the store
    assert d.propose([9, 9, 7, 40, 41], 3).tokens.tolist() == [42, 43, 44]  # a 2-token suffix seen before
    assert d.propose([7, 8, 42], 3) is None  # a single token is not looked up in the store
    # a suffix the context itself repeats wins over the store
    assert d.propose([40, 41, 5, 6, 40, 41], 2).tokens.tolist() == [5, 6]
    plain = NgramDrafter()
    plain.remember([1, 2, 3, 40, 41, 42, 43, 44])
    assert plain.propose([9, 9, 7, 40, 41], 3) is None  # without the mode nothing is remembered


def test_ngram_pool_drafts_only_from_earlier_conversations_on_three_token_matches():
    d = NgramDrafter()
    d.use_mode("pool")
    d.remember([1, 2, 3, 40, 41, 42, 43, 44])
    assert d.propose([9, 3, 40, 41], 3).tokens.tolist() == [42, 43, 44]
    assert d.propose([9, 9, 40, 41], 3) is None  # two tokens are not enough for the pool
    assert d.propose([5, 6, 7, 5, 6, 7], 2) is None  # the context's own repeat is prompt lookup's, not the pool's


def test_a_mix_hands_every_member_the_finished_conversation(engine):
    """The engine calls remember() with prompt + output when a generation ends, whichever member drafted (or none):
    the pool then drafts the answer to a question asked again, and the output stays plain decoding's."""
    from specrt.drafters.mixed import MixedDrafter
    from specrt.runtime.sampling import SamplingParams

    pool = NgramDrafter()
    pool.use_mode("pool")
    pool.name = "ngram:pool"
    mix = MixedDrafter([NgramDrafter(), pool])
    params = SamplingParams(max_new_tokens=24, stop_token_ids=())
    engine.reset()
    plain = engine.generate("the cat and the dog", params, drafter=None).wait()
    engine.reset()
    first = engine.generate("the cat and the dog", params, drafter=mix).wait()
    assert len(pool._store.sequences) == 1 and pool._store.sequences[0][-24:] == first.token_ids
    engine.reset()
    adaptive, engine.adaptive = engine.adaptive, False
    try:
        again = engine.generate("the cat and the dog", params, drafter=mix).wait()
    finally:
        engine.adaptive = adaptive
    assert first.token_ids == again.token_ids == plain.token_ids
    assert again.stats.drafts_by_drafter.get("ngram:pool", 0) > 0
    assert again.stats.target_calls < plain.stats.target_calls


def test_ngram_store_keeps_the_most_recent_tokens():
    from specrt.drafters.ngram.proposer import NgramStore

    store = NgramStore(capacity=10, min_n=2, max_n=3)
    store.add([1, 2, 3, 4, 5, 6])
    store.add([1, 2, 7, 8, 9, 10])
    assert store.follow((1, 2), 2) == [7, 8]  # the latest occurrence
    assert store.follow((3, 4), 2) == []  # the first sequence was dropped: 12 tokens exceed 10
    assert store.follow((9,), 2) == [] and store.follow((8, 9), 5) == [10]


def test_tree_bias_shows_only_ancestors():
    draft = Draft(np.array([7, 8, 9]), np.array([-1, -1, 1]))
    bias = tree_bias(draft, past=2)[0, 0]
    visible = bias == 0
    assert visible[:, :2].all()  # the past
    assert visible[:, 2].all()  # the pending token
    # rows: pending, 7, 8, 9; columns: past, past, pending, 7, 8, 9
    assert visible[2].tolist() == [True, True, True, False, True, False]  # 8 does not see its sibling 7
    assert visible[3].tolist() == [True, True, True, False, True, True]  # 9 sees its parent 8, not 7


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("mode", ["ngram", "right", "wrong", "tree"])
def test_greedy_speculative_equals_plain(engine, prompt, mode):  # noqa: F811
    engine.adaptive = mode == "ngram"  # fixed draft length where the test counts accepted tokens
    plain = engine.generate(prompt, PARAMS, drafter=None).wait()
    prompt_len = len(engine.prompt_ids(prompt))
    drafter = NgramDrafter() if mode == "ngram" else OracleDrafter(prompt_len, plain.token_ids, engine.manifest.vocab_size, mode)
    spec = engine.generate(prompt, PARAMS, drafter=drafter).wait()
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    if mode in ("right", "tree"):
        assert spec.stats.mean_accepted > 2.5  # several tokens per target call
        assert spec.stats.target_calls < plain.stats.target_calls / 2
    if mode == "wrong":
        assert spec.stats.acceptance_by_position[0] == 0.0
        assert spec.stats.mean_accepted == pytest.approx(1.0)
    # the cache still holds exactly the conversation: a follow-up reuses it and matches a fresh prefill
    follow = engine.generate([{"role": "user", "content": prompt}, {"role": "assistant", "content": plain.text},
                              {"role": "user", "content": "the city"}], PARAMS, drafter=None).wait()
    engine.reset()
    fresh = engine.generate([{"role": "user", "content": prompt}, {"role": "assistant", "content": plain.text},
                             {"role": "user", "content": "the city"}], PARAMS, drafter=None).wait()
    assert follow.token_ids == fresh.token_ids


def test_controller_drafts_long_when_cheap_and_right():
    from specrt.runtime.adaptive import DraftController

    c = DraftController(max_draft=4)
    for fed in range(1, 6):
        c.observe_call(fed, 0.010)  # verification costs what a plain step costs
    for _ in range(30):
        c.observe_draft(4, 4, 0.0, 4)  # everything accepted
    assert c.choose(budget=100) == 4
    assert c.choose(budget=3) == 2  # never drafts past the budget


def test_block_drafter_pays_its_call_once_for_any_length():
    """A block drafter (DFlash) spends the same on 1 or 4 draft tokens: with the same measurements (a draft of 4
    took 8 ms, verification is flat, half of each depth is accepted) it drafts the whole 4, where a drafter
    that pays per token (2 ms each) stops at 2 (1 by its estimates, one more while a 50 % acceptance leaves the
    estimate at depth 2 unsure enough that it might pay)."""
    from specrt.runtime.adaptive import DraftController, DrafterRecord

    choices = []
    for per_call in (False, True):
        c = DraftController(max_draft=4, per_call=per_call)
        for fed in range(1, 6):
            c.observe_call(fed, 0.010)
        c.start_from(DrafterRecord([0.5] * 4, draft_cost=0.008 if per_call else 0.002))
        choices.append(c.choose(budget=100))
    assert choices == [2, 4]


def test_controller_stops_drafting_when_it_does_not_pay_and_probes_again():
    from specrt.runtime.adaptive import DraftController

    c = DraftController(max_draft=4, probe_every=5)
    for fed in range(1, 6):  # a verification token costs 1 % of a step: a probe that fails wastes almost nothing, so
        c.observe_call(fed, 0.010 + 0.0001 * (fed - 1))  # its interval is the doubling one (a dear probe waits:
    for _ in range(30):                                    # tests/test_auto.py)
        c.observe_draft(1, 0, 0.0, 1)  # first draft token always rejected
    choices = []
    for _ in range(16):
        choices.append(c.choose(budget=100))
        if c.probing:
            c.probed()  # what the loop does when it drafts the probe
    # plain, with a probe after 5 plain steps, then after 10 more (each probe that does not pay doubles the wait)
    assert [i for i, k in enumerate(choices) if k] == [4, 14] and set(choices) == {0, 1}


def test_batch_invariant_mode_pads_one_token_calls(engine):  # noqa: F811
    """min_rows = 2: a one-token call runs as two rows, returns one row and leaves the cache one slot longer."""
    target = engine.target
    engine.reset()
    ids = np.array([engine.prompt_ids("the cat and the dog")])
    target.forward(ids)
    n = target.length
    one = target.forward(np.array([[7]]))
    target.rollback(n)
    target.min_rows = 2
    try:
        padded = target.forward(np.array([[7]]))
        assert padded.shape == one.shape and target.length == n + 1
        np.testing.assert_allclose(padded, one, atol=1e-4)  # fp32: same logits; int4: the multi-row rounding
        follow = target.forward(np.array([[9]]))  # the pad's slot was really dropped
        target.rollback(n + 1)
        target.min_rows = 1
        np.testing.assert_allclose(follow, target.forward(np.array([[9]])), atol=1e-4)
    finally:
        target.min_rows = 1
        engine.reset()


@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
def test_device_path_equals_host_path(engine, mode):  # noqa: F811
    """The GPU path on the CPU: logits handed to the Triton kernel (interpreted) through DLPack without a
    copy, tree paths compacted by the Triton kernel in the OrtValues' memory. Greedy output equals plain
    decoding, and a seeded sampled run draws the same tokens as the numpy path (same random numbers)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    prompt = PROMPTS[1]
    params = SamplingParams(max_new_tokens=12, stop_token_ids=())
    engine.adaptive = False
    plain = engine.generate(prompt, params, drafter=None).wait()
    drafter = OracleDrafter(len(engine.prompt_ids(prompt)), plain.token_ids, engine.manifest.vocab_size, mode)
    sampled = SamplingParams(max_new_tokens=12, stop_token_ids=(), temperature=1.0, top_p=0.9, seed=11)
    engine.reset()
    host = engine.generate(prompt, sampled, drafter=drafter).wait()
    engine.device_verify, engine.target.kernel_compaction = True, True
    try:
        engine.reset()
        assert engine.generate(prompt, params, drafter=drafter).wait().token_ids == plain.token_ids
        engine.reset()
        assert engine.generate(prompt, sampled, drafter=drafter).wait().token_ids == host.token_ids
    finally:
        engine.device_verify, engine.target.kernel_compaction = False, False
        engine.reset()


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_sampling_on_the_tiny_model_matches_its_distribution(engine, shape):  # noqa: F811
    """The tiny bundle's own logits (after a prompt, and after each possible first token), a draft distribution
    that differs from the target's, temperature 1, top-p 0.9, 20,000 samples: the first and the second output
    token each follow the target's distribution (chi-square on each marginal; the joint has too many cells)."""
    from tests.test_verify import _chi_square_p, sample_two_tokens
    from specrt.runtime.sampling import target_probs

    rng = np.random.default_rng(5)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    target = engine.target
    engine.reset()
    prompt = np.array([engine.prompt_ids(PROMPTS[0])])
    l1 = target.forward(prompt)[0, -1].astype(np.float64) * 4  # sharpened: the random model is nearly uniform
    base = target.length
    rows = []
    for x in range(len(l1)):  # target logits after each possible first token
        target.rollback(base)
        rows.append(target.forward(np.array([[x]]))[0, -1])
    l2 = np.stack(rows).astype(np.float64) * 4
    target.rollback(0)
    engine.reset()
    v = len(l1)

    def draft_dist(logits):  # a drafter that roughly agrees with the target
        q = np.exp(logits / 4 * 3 + rng.normal(size=logits.shape))
        return q / q.sum(-1, keepdims=True)

    counts = sample_two_tokens(l1, l2, draft_dist(l1), draft_dist(l2), shape, params, rng)
    p1 = target_probs(l1, params)
    p2 = (p1[:, None] * np.stack([target_probs(l2[x], params) for x in range(v)])).sum(0)
    assert _chi_square_p(counts.sum(1), p1) > 0.01
    assert _chi_square_p(counts.sum(0), p2) > 0.01


def test_padded_rows_rule():
    from specrt.runtime.target_session import TargetSession

    session = TargetSession.__new__(TargetSession)  # the rule only: no graph needed
    session.min_rows, session.even_rows = 1, False
    assert [session.padded_rows(s) for s in (1, 2, 3, 5)] == [1, 2, 3, 5]
    session.min_rows = 2
    assert [session.padded_rows(s) for s in (1, 2, 3, 5)] == [2, 2, 3, 5]
    session.even_rows = True
    assert [session.padded_rows(s) for s in (1, 2, 3, 5, 8)] == [2, 2, 4, 6, 8]


@pytest.fixture(scope="module")
def block64_bundle(tmp_path_factory):
    from tests.tiny_models import convert_tiny_llama

    return convert_tiny_llama(tmp_path_factory.mktemp("b64"), "int4-b64", 3, "--precision", "int4",
                              "--int4-block-size", "64")


def test_int4_blocks_of_64_record_their_size_and_stay_exact(block64_bundle):
    """The manifest records the block size, batch-invariant mode turns the even-row rule on for it (the kernel
    property behind the rule: tests/test_quantize.py), and greedy speculation equals plain decoding."""
    import specrt
    from specrt.bundle import load_bundle

    assert load_bundle(block64_bundle).target.int4_block_size == 64
    b64 = specrt.load(str(block64_bundle), device="cpu", drafter="ngram", batch_invariant=True)
    # blocks of 64 round an odd call's last row alone: exact calls pad to even row counts, not only the attention
    assert not b64.rows_invariant and b64.target.min_rows == 2 and b64.target.even_rows
    for prompt in PROMPTS:
        plain = b64.generate(prompt, PARAMS, drafter=None).wait()
        spec = b64.generate(prompt, PARAMS).wait()
        assert spec.token_ids == plain.token_ids
    b64.batch_invariant = False
    assert not b64.target.even_rows


def test_int4_block_size_is_checked(tmp_path, capsys):
    from specrt.cli import main

    code = main(["convert", "nowhere", "-o", str(tmp_path / "x"), "--precision", "int4", "--int4-block-size", "48"])
    assert code == 2 and "48" in capsys.readouterr().err
