"""The draft-model drafter on tiny models: convert --drafter, tokenizer refusal, losslessness, bench."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specrt
from specrt.bundle import load_bundle
from specrt.cli import main
from specrt.errors import SpecrtError
from specrt.runtime.sampling import SamplingParams
from tests.tiny_models import save_tiny_bundle_source

PARAMS = SamplingParams(max_new_tokens=30, stop_token_ids=())
PROMPTS = ("the cat and the dog", "a man in the house of the world", "the world the world the world")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    return {
        "target": save_tiny_bundle_source("llama", root / "target", seed=0),
        "other": save_tiny_bundle_source("qwen3", root / "other", seed=1),  # another architecture, same tokenizer
    }


@pytest.fixture(scope="module")
def bundle(sources, tmp_path_factory):
    out = tmp_path_factory.mktemp("b") / "with-draft"
    assert main(["convert", str(sources["target"]), "-o", str(out), "--max-context", "96",
                 "--drafter", f"draft-model:{sources['other']}"]) == 0
    return out


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bundle_holds_the_draft_graph(bundle, capsys):
    manifest = load_bundle(bundle)  # sizes and sha256 of the draft graph too
    entry = manifest.drafter("draft-model")
    assert entry.graph.file == "draft.onnx" and "draft.onnx.data" in manifest.files
    assert entry.model_config["model_type"] == "qwen3"
    assert entry.raw["validation"]["source"]["max_abs_diff"] < 1e-3
    code, out, _ = run(["info", str(bundle)], capsys)
    assert code == 0 and "draft-model (draft-model:" in out


def test_a_draft_vocabulary_cuts_the_head_and_stays_lossless(sources, tmp_path, monkeypatch, capsys):
    """--draft-vocab 40: the draft graph's head keeps the 40 most frequent tokens of the corpus (here the test
    prompts), checked against the whole head at conversion; drafts use only those tokens; output unchanged."""
    import specrt.convert.draft_vocab_head as draft_vocab_head
    from specrt.drafters.draft_vocab import load_draft_targets

    monkeypatch.setattr(draft_vocab_head, "corpus_texts", lambda: list(PROMPTS) * 3)
    out = tmp_path / "cut"
    assert main(["convert", str(sources["target"]), "-o", str(out), "--max-context", "96",
                 "--drafter", f"draft-model:{sources['other']}", "--draft-vocab", "40"]) == 0
    entry = load_bundle(out).drafter("draft-model")  # the d2t map is hashed with the graph
    assert entry.vocab_size == 40 and entry.extra_files == ("draft.d2t.safetensors",)
    assert entry.raw["draft_vocab"]["check_max_abs_diff"] < 1e-3
    kept = set(load_draft_targets(out, entry).tolist())
    engine = specrt.load(str(out), device="cpu", drafter="draft-model")
    engine.adaptive = False
    for prompt in PROMPTS:
        plain = engine.generate(prompt, PARAMS, drafter=None).wait()
        spec = engine.generate(prompt, PARAMS).wait()
        assert spec.token_ids == plain.token_ids
        context = engine.prompt_ids(prompt) + plain.token_ids[:5]
        engine.drafter.reset()
        assert set(engine.drafter.propose(context, 4).tokens.tolist()) <= kept
    code, _, err = run(["convert", str(sources["target"]), "-o", str(tmp_path / "x"), "--draft-vocab", "40"], capsys)
    assert code == 2 and "--drafter draft-model:MODEL" in err


@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_draft_model_equals_plain(bundle, adaptive):
    engine = specrt.load(str(bundle), device="cpu", drafter="draft-model")
    engine.adaptive = adaptive
    for prompt in PROMPTS:
        plain = engine.generate(prompt, PARAMS, drafter=None).wait()
        spec = engine.generate(prompt, PARAMS).wait()
        assert spec.token_ids == plain.token_ids
        assert spec.stats.drafter == "draft-model"
    if not adaptive:
        assert spec.stats.acceptance_by_position  # it drafted


def test_the_targets_own_bundle_as_draft_model_is_always_accepted(sources, bundle, tmp_path):
    """A bundle given as the draft model is copied in (no reconversion); drafting with the target's own
    graph must be accepted at every position."""
    out = tmp_path / "self-draft"
    plain_bundle = tmp_path / "plain"
    assert main(["convert", str(sources["target"]), "-o", str(plain_bundle), "--max-context", "96"]) == 0
    assert main(["convert", str(sources["target"]), "-o", str(out), "--max-context", "96",
                 "--drafter", f"draft-model:{plain_bundle}"]) == 0
    engine = specrt.load(str(out), device="cpu", drafter="draft-model")
    engine.adaptive = False
    spec = engine.generate(PROMPTS[0], PARAMS).wait()
    assert spec.token_ids == engine.generate(PROMPTS[0], PARAMS, drafter=None).wait().token_ids
    assert spec.stats.acceptance_by_position == [1.0] * 4
    assert spec.stats.mean_accepted > 4.0


def test_sampling_draft_hands_its_distribution_to_the_verifier(bundle):
    engine = specrt.load(str(bundle), device="cpu", drafter="draft-model")
    drafter = engine.drafter
    drafter.reset(SamplingParams(temperature=1.0, top_k=5), np.random.default_rng(0))
    draft = drafter.propose(engine.prompt_ids(PROMPTS[0]), 3)
    assert draft.probs.shape == (3, engine.manifest.vocab_size)
    np.testing.assert_allclose(draft.probs.sum(1), 1.0, rtol=1e-6)
    assert ((draft.probs > 0).sum(1) == 5).all()  # top-k applied to the draft distribution
    assert all(draft.probs[i, t] > 0 for i, t in enumerate(draft.tokens))
    sampled = engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=20, temperature=1.0, seed=3)).wait()
    assert len(sampled.token_ids) > 0


def _swap_token(folder: Path, token_id: int, new: str) -> None:
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    old = next(t for t, i in vocab.items() if i == token_id)
    vocab[new] = vocab.pop(old)
    path.write_text(json.dumps(data))


def test_a_drafter_with_another_tokenizer_is_refused(sources, tmp_path, capsys):
    other = save_tiny_bundle_source("llama", tmp_path / "mismatch", seed=2)
    _swap_token(other, 10, "zebra")
    out = tmp_path / "out"
    code, _, err = run(["convert", str(sources["target"]), "-o", str(out), "--drafter", f"draft-model:{other}"], capsys)
    assert code == 2
    assert "different tokenizer" in err and "token id 10" in err and "zebra" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mismatch"]  # nothing left behind


@pytest.mark.parametrize("spec, message", [
    ("draft-model:self-int4", "already int4"),
    ("mtp:/no/such/folder", "no such checkpoint folder"),
    ("dflash:/no/such/folder", "no such checkpoint folder"),
    ("mtp", "no MTP module"),  # a target without one
    ("eagle3:/no/such/folder", "no such checkpoint folder"),
    ("ngram", "needs no conversion"),
    ("draft-model", "names no model"),
    ("magic:x", "unknown drafter kind"),
])
def test_bad_drafter_specs(sources, tmp_path, capsys, spec, message):
    code, _, err = run(["convert", str(sources["target"]), "-o", str(tmp_path / "o"), "--precision", "int4",
                        "--drafter", spec], capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "o").exists()


def test_a_bundle_without_a_draft_model_says_how_to_add_one(sources, tmp_path):
    plain_bundle = tmp_path / "plain"
    assert main(["convert", str(sources["target"]), "-o", str(plain_bundle), "--max-context", "64"]) == 0
    with pytest.raises(SpecrtError, match="--drafter draft-model:"):
        specrt.load(str(plain_bundle), device="cpu", drafter="draft-model")


def test_bench_writes_the_documented_json(bundle, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "id": i}) for i, p in enumerate(PROMPTS)) + "\n")
    out = tmp_path / "r.json"
    # a fixed draft length: every row drafts whatever the machine's timings (the adaptive loop's choices are not
    # what this test is about)
    code, text, err = run(["bench", str(bundle), "--prompts", str(prompts), "--max-new-tokens", "16",
                           "--drafter", "ngram", "--drafter", "draft-model", "--draft-length", "2", "--json", str(out),
                           "--markdown", str(tmp_path / "r.md"), "--plot", str(tmp_path / "r.png")], capsys)
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["machine"]["cores"] >= 1 and report["machine"]["providers"] == ["CPUExecutionProvider"]
    table = (tmp_path / "r.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| dataset")]
    assert [row.split(" | ")[2] for row in rows] == ["none", "ngram", "draft-model"]
    assert all(row.startswith("| prompts | specrt |") and row.split(" | ")[-2] == "3/3" for row in rows)
    # the last column: the share of decode steps each drafter drafted (and plain ones), empty for plain decoding
    assert rows[0].endswith(" |  |") and all(row.split(" | ")[-1].rstrip(" |").endswith("%") for row in rows[1:])
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert report["model"] == str(bundle) and report["prompts"] == 3 and report["max_new_tokens"] == 16
    assert report["datasets"] == {"prompts": 3}
    assert [r["drafter"] for r in report["results"]] == ["none", "ngram", "draft-model"]
    for r in report["results"]:
        assert r["system"] == "specrt" and r["precision"] == "fp32" and r["dataset"] == "prompts" and r["prompts"] == 3
        assert r["tokens_per_second"] > 0 and r["mean_accepted"] >= 1.0 and r["speedup"] > 0
        assert r["identical_to_plain"] == 3  # greedy: every drafter reproduces plain decoding
        if r["drafter"] != "none":  # what the adaptive loop chose, step by step: drafted by it, or plainly
            assert set(r["steps_by_drafter"]) <= {r["drafter"], "none"} and sum(r["steps_by_drafter"].values()) > 0
    assert report["results"][0]["speedup"] == 1.0 and report["results"][0]["mean_accepted"] == 1.0
    assert report["results"][0]["acceptance_by_position"] == []  # plain decoding drafts nothing
    depth = report["results"][2]["acceptance_by_position"]
    assert 1 <= len(depth) <= 4 and all(0.0 <= a <= 1.0 for a in depth)
    assert "draft-model" in text and "speedup" in text


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a"}\nnot json\n', ":2: not JSON"),
    ('{"text": "a"}\n', 'record 1 has neither a non-empty string "prompt" nor "messages"'),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n',
     'record 1 has neither'),  # a conversation to continue ends with a user turn
    ("", "no prompts"),
])
def test_bench_refuses_bad_prompt_files(bundle, tmp_path, capsys, content, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(content)
    code, _, err = run(["bench", str(bundle), "--prompts", str(prompts)], capsys)
    assert code == 2 and message in err


def test_bench_takes_follow_up_conversations(bundle, tmp_path):
    """A prompts file may hold a conversation to continue (a follow-up question after an answer): it is rendered
    through the chat template as that message list, every system given the same ids."""
    from specrt.datasets import load_prompts

    follow = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "the dog"},
              {"role": "user", "content": "and the house?"}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat"}) + "\n" + json.dumps({"messages": follow}) + "\n")
    got = load_prompts(prompts)
    assert got == ["the cat", follow]
    out = tmp_path / "r.json"
    assert main(["bench", str(bundle), "--prompts", str(prompts), "--max-new-tokens", "8", "--device", "cpu",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert rows[0]["prompts"] == 2 and len(rows[0]["tokens_per_second_by_prompt"]) == 2


def test_bench_needs_exactly_one_prompt_source(bundle, capsys):
    code, _, err = run(["bench", str(bundle)], capsys)
    assert code == 2 and "exactly one of" in err
    code, _, err = run(["bench", str(bundle), "--dataset", "nope"], capsys)
    assert code == 2 and "unknown dataset" in err


def test_chat_status_line_shows_acceptance(bundle):
    from specrt.app.chat_cli import _status

    engine = specrt.load(str(bundle), device="cpu", drafter="draft-model")
    engine.adaptive = False
    line = _status(engine.generate(PROMPTS[0], PARAMS).wait())
    assert "draft-model:" in line and "tokens/call" in line and "accepted by depth" in line
    assert line.count("%") == 4  # one share per draft depth (max draft 4)


@pytest.mark.parametrize("adaptive", [False, True])
def test_draft_model_mixed_with_ngram_is_lossless_and_uses_both(bundle, adaptive):
    """The mix drafts with prompt lookup where the context repeats and with the draft model elsewhere;
    greedy output equals plain decoding either way."""
    engine = specrt.load(str(bundle), device="cpu", drafter="draft-model+ngram")
    engine.adaptive = adaptive
    used: dict[str, int] = {}
    for prompt in PROMPTS:
        plain = engine.generate(prompt, PARAMS, drafter=None).wait()
        spec = engine.generate(prompt, PARAMS).wait()
        assert spec.token_ids == plain.token_ids
        assert spec.stats.drafter == "draft-model+ngram"
        for name, n in spec.stats.drafts_by_drafter.items():
            used[name] = used.get(name, 0) + n
    assert set(used) <= {"draft-model", "ngram"}
    if not adaptive:  # asked in order: the draft model always offers a draft
        assert used.get("draft-model", 0) > 0


def test_the_mix_asks_the_member_with_the_better_rate_first(bundle):
    """With prompt lookup's acceptance measured high and the draft model's low, the stepper asks prompt lookup
    first, and falls back to the draft model when prompt lookup has no match."""
    from specrt.runtime.decode_target import EngineTarget
    from specrt.runtime.speculative import SpeculativeStepper

    engine = specrt.load(str(bundle), device="cpu", drafter="draft-model+ngram")
    stepper = SpeculativeStepper(EngineTarget(engine), PARAMS, engine.drafter, max_draft=4)
    assert [m.name for m in stepper.members] == ["draft-model", "ngram"]
    dm, ng = stepper.controllers
    assert dm.cost is ng.cost  # one table of target call costs
    for _ in range(20):
        dm.observe_draft(4, 0, 0.01, 4)  # the draft model misses at once
        ng.observe_draft(4, 4, 0.0, 4)  # prompt lookup is always right
    plans = stepper._plans(budget=30)
    assert plans and plans[0][0] == 1  # ngram first
    assert all(i != 0 for i, _ in plans)  # the draft model no longer pays for itself


def test_auto_means_the_mix_for_a_bundle_with_a_draft_model(bundle):
    engine = specrt.load(str(bundle), device="cpu", drafter="auto")
    assert engine.drafter.name == "draft-model+ngram+ngram:pool"


@pytest.mark.parametrize("name,message", [
    ("ngram+ngram", "two or more different"), ("draft-model+none", "two or more different"),
    ("ngram+nope", "unknown"),
])
def test_bad_mixes_are_refused(bundle, name, message):
    with pytest.raises(SpecrtError, match=message):
        specrt.load(str(bundle), device="cpu", drafter=name)
