"""`specrt bench --synth-len L`: the acceptance that gives L tokens a call (llama-server's --spec-synth-len), and the
replay rows on the real default model with its draft model paying the drafting cost."""

from __future__ import annotations

import pytest

from specrt.app.bench import run_bench
from specrt.app.bench_replay import synth_acceptance
from specrt.errors import SpecrtError
from specrt.runtime.sampling import SamplingParams


@pytest.mark.parametrize("length, n_max", [(1.5, 3), (2.0, 3), (3.0, 3), (1.8, 1), (4.5, 6)])
def test_the_acceptance_gives_the_mean_tokens_a_call(length, n_max):
    p = synth_acceptance(length, n_max)
    # a call yields the target's token and a geometric prefix of the draft: 1 + p + p^2 + ... + p^n_max
    assert 1 + sum(p ** j for j in range(1, n_max + 1)) == pytest.approx(length, abs=1e-9)
    assert 0.0 < p < 1.0


def test_the_ends_of_the_range_and_outside_it():
    assert synth_acceptance(1.0, 3) == pytest.approx(0.0, abs=1e-9)
    assert synth_acceptance(4.0, 3) == pytest.approx(1.0, abs=1e-9)
    assert synth_acceptance(2.0, 3) == pytest.approx(0.5437, abs=1e-4)  # p + p^2 + p^3 = 1
    for length in (0.9, 4.01):
        with pytest.raises(ValueError, match=r"within \[1, 4\]"):
            synth_acceptance(length, 3)


def test_replay_rows_keep_plain_output_and_accept_at_the_stated_length(fp32_bundle):
    """At L = 1 nothing is accepted, at L = K + 1 everything: the target's token plus K drafts a call; the output
    is plain decoding's either way (the replay proposes plain's tokens or wrong ones)."""
    params = SamplingParams(max_new_tokens=16, stop_token_ids=())
    report = run_bench(str(fp32_bundle), {"p": ["The capital of France is", "def add(a, b):"]}, [], ["fp32"], params,
                       device="cpu", batch_invariant=True, synth_lengths=[1.0, 4.0], log=lambda m: None)
    rows = {r["drafter"]: r for r in report["results"]}
    assert set(rows) == {"none", "synth-1", "synth-4"} and report["synth_lengths"] == [1.0, 4.0]
    for name in ("synth-1", "synth-4"):
        assert rows[name]["identical_to_plain"] == 2, rows[name]
        assert rows[name]["steps_by_drafter"], rows[name]  # the draft model ran (its cost paid)
    assert rows["synth-1"]["mean_accepted"] == pytest.approx(1.0)
    assert rows["synth-1"]["acceptance_by_position"] == [0.0, 0.0, 0.0]
    assert rows["synth-4"]["acceptance_by_position"] == [1.0, 1.0, 1.0]
    assert rows["synth-4"]["mean_accepted"] > 3.0  # 4 a call, but the last call of 16 tokens may be cut short


def test_synth_len_outside_the_draft_length_or_sampled_is_refused(fp32_bundle):
    params = SamplingParams(max_new_tokens=4, stop_token_ids=())
    with pytest.raises(SpecrtError, match=r"--synth-len 5: .*within \[1, 4\] for 3 draft tokens"):
        run_bench(str(fp32_bundle), {"p": ["hi"]}, [], ["fp32"], params, device="cpu", synth_lengths=[5.0],
                  log=lambda m: None)
    sampled = SamplingParams(max_new_tokens=4, temperature=0.7, stop_token_ids=())
    with pytest.raises(SpecrtError, match="--temperature 0"):
        run_bench(str(fp32_bundle), {"p": ["hi"]}, [], ["fp32"], sampled, device="cpu", synth_lengths=[2.0],
                  log=lambda m: None)


def test_another_systems_draft_count_gives_its_tokens_per_call():
    """llama-server reports the drafts it made and those accepted: each decode call yields its own token and the
    accepted drafts, so 64 tokens with 40 accepted are 63 decode-phase tokens over 23 calls."""
    from specrt.app.bench import SystemRuns, summarize
    from specrt.app.bench_contestants import Sample

    plain = SystemRuns("specrt", "none", "gguf")
    plain.add([Sample(list(range(64)), 10.0)])
    other = SystemRuns("llama-server", "synth-3", "Q4_K_M")
    other.add([Sample(list(range(64)), 20.0, draft=(60, 40))])
    rows = {r["system"]: r for r in summarize({("specrt", "none"): plain, ("llama-server", "synth-3"): other},
                                              greedy=True, dataset="d")}
    assert rows["llama-server"]["mean_accepted"] == pytest.approx(63 / 23)
    assert rows["llama-server"]["draft_acceptance"] == pytest.approx(40 / 60)
    assert rows["llama-server"]["wasted_per_call"] == pytest.approx(20 / 23)
    assert rows["llama-server"]["speedup"] == pytest.approx(2.0)
