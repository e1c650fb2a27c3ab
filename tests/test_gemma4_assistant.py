"""Gemma 4's assistant drafter on tiny random checkpoints of transformers' own classes: its drafts equal
transformers' (Gemma4AssistantForCausalLM over the target's shared KV, both head forms), greedy speculation with it
equals plain decoding (fp32, and int4 in batch-invariant mode), sampled output follows the target's distribution,
and an assistant that does not fit the target is refused in one line naming both values."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from specrt.cli import main
from specrt.runtime.sampling import SamplingParams
from tests.tiny_models import (
    assert_refused_in_one_line, assert_sampled_tokens_follow_the_target, hf_assistant, hf_model,
    save_tiny_bundle_source,
)

PROMPTS = ("the cat and the dog", "a man in the house of the world", "what is the time of day for you")
GREEDY = SamplingParams(max_new_tokens=48, stop_token_ids=())


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4_assistant")
    out = {"target": save_tiny_bundle_source("gemma4_text", root / "target"),
           "moe_target": save_tiny_bundle_source("gemma4_moe", root / "moe_target")}  # the same head sizes
    for name, ordered in (("plain", False), ("ordered", True)):
        hf_assistant(ordered).save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def bundles(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4_assistant_bundles")
    out = {"plain": root / "fp32", "ordered": root / "int4", "moe": root / "moe"}
    assert main(["convert", str(sources["target"]), "-o", str(out["plain"]), "--max-context", "128",
                 "--drafter", f"assistant:{sources['plain']}"]) == 0
    assert main(["convert", str(sources["moe_target"]), "-o", str(out["moe"]), "--max-context", "128",
                 "--drafter", f"assistant:{sources['plain']}"]) == 0
    assert main(["convert", str(sources["target"]), "-o", str(out["ordered"]), "--max-context", "128",
                 "--precision", "int4", "--drafter", f"assistant:{sources['ordered']}"]) == 0
    return out


def _transformers_draft(target, assistant, ids: list[int], steps: int) -> list[int]:
    """transformers' own drafting (its SinglePositionMultiTokenCandidateGenerator's loop): the target reads ids[:-1],
    then the assistant drafts `steps` tokens at the position of ids[-1] over the target's shared KV."""
    n = len(ids) - 1
    x = torch.tensor([ids])
    with torch.no_grad():
        out = target(x[:, :n], output_hidden_states=True, return_shared_kv_states=True)
        shared = {k: (v[0][:, :, :n + 1], v[1][:, :, :n + 1]) for k, v in out.shared_kv_states.items()}
        hidden, token, drafted = out.hidden_states[-1][:, -1:], x[:, -1:], []
        for _ in range(steps):
            embeds = torch.cat([target.get_input_embeddings()(token), hidden], dim=-1)
            o = assistant(inputs_embeds=embeds, attention_mask=torch.ones(1, n + 1, dtype=torch.long),
                          position_ids=torch.tensor([[n]]), shared_kv_states=shared, use_cache=False)
            token, hidden = o.logits.argmax(-1), o.last_hidden_state
            drafted.append(int(token))
    return drafted


@pytest.mark.parametrize("form, arch", [("plain", "gemma4_text"), ("ordered", "gemma4_text"), ("plain", "gemma4_moe")])
def test_drafts_equal_transformers(sources, tmp_path, form, arch):
    """Prompts shorter and longer than the sliding window (4), over the E2B-like target (shared KV: the assistant
    reads layers 2 and 3) and the MoE one: every drafted token is transformers' own."""
    import specrt

    bundle = tmp_path / "bundle"
    source = sources["target" if arch == "gemma4_text" else "moe_target"]
    assert main(["convert", str(source), "-o", str(bundle), "--max-context", "128",
                 "--drafter", f"assistant:{sources[form]}"]) == 0
    engine = specrt.load(str(bundle), device="cpu", drafter="assistant")
    target, assistant = hf_model(arch), hf_assistant(form == "ordered")
    for prompt in PROMPTS:
        engine.generate(prompt, SamplingParams(max_new_tokens=1, stop_token_ids=())).wait()  # the target reads it
        for pending in (5, 40):
            context = engine.cached_tokens() + [pending]
            assert len(context) > 5
            draft = engine.drafter.propose(context, 4)
            assert draft.tokens.tolist() == _transformers_draft(target, assistant, context, 4), (prompt, pending)


@pytest.mark.parametrize("form", ["plain", "ordered", "moe"])
def test_greedy_speculation_is_lossless(bundles, form):
    import specrt

    engine = specrt.load(str(bundles[form]), device="cpu", drafter="assistant", batch_invariant=form == "ordered")
    engine.adaptive, engine.draft_length = False, 3
    drafted = 0
    for prompt in PROMPTS:
        plain = engine.generate(prompt, GREEDY, drafter=None).wait()
        spec = engine.generate(prompt, GREEDY).wait()
        assert spec.token_ids == plain.token_ids and spec.stats.drafter == "assistant"
        drafted += sum(spec.stats.drafted_by_position)
    assert drafted > 0
    engine.adaptive = True  # the controller's own lengths (it may stop drafting): still plain decoding's tokens
    for prompt in PROMPTS[:1]:
        assert engine.generate(prompt, GREEDY).wait().token_ids == engine.generate(prompt, GREEDY,
                                                                                     drafter=None).wait().token_ids


def test_sampled_output_follows_the_targets_distribution(bundles):
    """Temperature 0.7, the assistant drafting 2 tokens a step (sampled, with its q), 2000 samples: the first and
    the second output token (the second verified with a draft) each follow the target's own distribution."""
    import specrt

    engine = specrt.load(str(bundles["plain"]), device="cpu", drafter="assistant")
    engine.adaptive, engine.draft_length = False, 2
    assert_sampled_tokens_follow_the_target(engine, PROMPTS[0], samples=2000)


def _edit(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("text_"):
            cfg["text_config"][key[len("text_"):]] = value
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, message", [
    ({"backbone_hidden_size": 48}, "its backbone_hidden_size is 48, the target's hidden size is 64"),
    ({"text_vocab_size": 96}, "its vocabulary has 96 tokens, the target's 97"),
    ({"text_per_layer_config": {"1": {"head_dim": 64, "num_key_value_heads": 1}}},
     "its layer 1 (full_attention) has 1 KV heads of size 64, the target layer 3 it reads has 1 of size 32"),
    ({"text_sliding_window": 8}, "its sliding window is 8, the target's 4"),
])
def test_an_assistant_that_does_not_fit_is_refused(sources, tmp_path, capsys, changes, message):
    folder = tmp_path / "assistant"
    shutil.copytree(sources["plain"], folder)
    _edit(folder, **changes)
    out = tmp_path / "out"
    assert_refused_in_one_line(["convert", str(sources["target"]), "-o", str(out), "--drafter",
                                f"assistant:{folder}"], out, capsys, re.escape(message))


def test_export_drafter_says_what_the_engines_take(bundles, tmp_path, capsys):
    main(["export-drafter", str(bundles["plain"]), "--for", "vllm", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "assistant: not exported: the engines load Gemma 4's assistant checkpoint as it is" in err


def test_large_tables_are_quantized_in_chunks_of_rows(sources, tmp_path, monkeypatch):
    """int4 reads a table larger than QUANTIZE_READ_BYTES a chunk of rows at a time (262144-token tables are GBs as
    float32): here every table is "large", and the assistant's tied head and the target's embedding it carries are
    read through row reads and still validated exactly."""
    from specrt.bundle import load_bundle
    from specrt.convert import target_graph

    monkeypatch.setattr(target_graph, "QUANTIZE_READ_BYTES", 4096)
    out = tmp_path / "bundle"
    assert main(["convert", str(sources["target"]), "-o", str(out), "--max-context", "128", "--precision", "int4",
                 "--drafter", f"assistant:{sources['plain']}"]) == 0
    entry = load_bundle(out).drafter("assistant")
    assert entry.raw["graph"]["precision"] == "int4" and entry.raw["validation"]["max_abs_diff"] < 1e-3
