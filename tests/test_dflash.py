"""The DFlash drafter on tiny random weights: torch definition, reference checkpoint layout, ONNX graph, lossless
drafting, the confidence cut, and training (the loss falls; an interrupted run resumes exactly)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from specrt.drafters.dflash.schedule import cut_length, expected_tokens
from specrt.errors import SourceError
from specrt.models.dflash import (
    DFlashDraft, dflash_config_from_hf, load_dflash_checkpoint, model_from_tensors, save_dflash_checkpoint,
    state_dict_of,
)
from tests.test_eagle3 import TARGET
from tests.tiny_models import COMMON

# the reference layout: a Qwen3 config with dflash_config (z-lab/dflash)
DFLASH_HF = {**COMMON, "model_type": "qwen3", "num_hidden_layers": 2, "rope_theta": 10000.0,
             "architectures": ["DFlashDraftModel"],
             "dflash_config": {"target_layer_ids": [0, 2], "block_size": 4, "mask_token_id": 96}}


def random_draft(seed: int = 0, hf: dict = DFLASH_HF) -> DFlashDraft:
    torch.manual_seed(seed)
    model = DFlashDraft(dflash_config_from_hf(hf, TARGET)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def write_reference_checkpoint(folder, model: DFlashDraft, prefix: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({prefix + k: v for k, v in state_dict_of(model).items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(DFLASH_HF))


@pytest.mark.parametrize("prefix", ["", "model."])
def test_reference_layout_checkpoint_loads_and_round_trips(tmp_path, prefix):
    model = random_draft(1)
    write_reference_checkpoint(tmp_path / "ref", model, prefix)
    cfg, tensors = load_dflash_checkpoint(tmp_path / "ref", TARGET)
    assert cfg.target_layer_ids == (0, 2) and cfg.block_size == 4 and cfg.mask_token_id == 96
    assert cfg.layers.qk_norm and cfg.layers.num_layers == 2
    save_dflash_checkpoint(tmp_path / "ours", cfg, tensors)  # what train-drafter writes: the same layout
    cfg2, tensors2 = load_dflash_checkpoint(tmp_path / "ours", TARGET)
    assert cfg2 == cfg and all(np.array_equal(tensors[k], tensors2[k]) for k in tensors)
    feats = torch.randn(1, 5, cfg.feature_width)
    block = torch.randn(1, 4, cfg.layers.hidden_size)
    pos = torch.arange(9)[None]
    a, _ = model(feats, block, pos[:, :5], pos[:, 5:], model.empty_cache())
    b, _ = model_from_tensors(cfg2, tensors2)(feats, block, pos[:, :5], pos[:, 5:], model.empty_cache())
    torch.testing.assert_close(a, b)


def test_cached_context_equals_one_call():
    """Reading the context in two calls (the second from the first's keys/values) equals reading it at once;
    and the block is not causal: its first position sees the masks after it."""
    model = random_draft(2)
    cfg = model.cfg
    feats = torch.randn(1, 7, cfg.feature_width)
    block = torch.randn(1, 4, cfg.layers.hidden_size)
    pos = torch.arange(11)[None]
    with torch.no_grad():
        whole, _ = model(feats, block, pos[:, :7], pos[:, 7:], model.empty_cache())
        _, first = model(feats[:, :4], block, pos[:, :4], pos[:, 7:], model.empty_cache())
        split, _ = model(feats[:, 4:], block, pos[:, 4:7], pos[:, 7:], first)
        torch.testing.assert_close(whole, split, rtol=1e-5, atol=1e-5)
        changed = block.clone()
        changed[:, 3] += 1.0
        other, _ = model(feats, changed, pos[:, :7], pos[:, 7:], model.empty_cache())
    assert not torch.allclose(whole[:, 0], other[:, 0])  # position 0 attends to position 3


@pytest.mark.parametrize("change, message", [
    ({"dflash_config": {"target_layer_ids": [0, 5], "block_size": 4, "mask_token_id": 96}}, "target_layer_ids [0, 5] names layers outside the target's 3"),
    ({"dflash_config": {"target_layer_ids": [0, 2], "block_size": 4, "mask_token_id": 200}}, "mask token id 200"),
    ({"dflash_config": {"target_layer_ids": [0, 2], "block_size": 4}}, "mask token id -1"),
    ({"dflash_config": {"target_layer_ids": [0, 2], "block_size": 1, "mask_token_id": 5}}, "block size 1"),
    ({"dflash_config": {}}, "lacks dflash_config.target_layer_ids"),
    ({"hidden_size": 32, "head_dim": 8}, "hidden size 32"),
    ({"vocab_size": 98}, "vocabulary 98"),
])
def test_bad_configs_are_named(change, message):
    with pytest.raises(SourceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        dflash_config_from_hf({**DFLASH_HF, **change}, TARGET)


def test_bad_checkpoint_files_are_named(tmp_path):
    model = random_draft()
    write_reference_checkpoint(tmp_path / "a", model)
    state = {k: v for k, v in state_dict_of(model).items() if k != "fc.weight"}
    save_file(state, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(SourceError, match="lacks tensor fc.weight"):
        load_dflash_checkpoint(tmp_path / "a", TARGET)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps(DFLASH_HF))
    (tmp_path / "b" / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(SourceError, match="pytorch_model.bin is a pickle file"):
        load_dflash_checkpoint(tmp_path / "b", TARGET)


@pytest.fixture(scope="module")
def dflash_bundle(tmp_path_factory):
    """A tiny target converted with a random DFlash drafter (reference layout) and a random EAGLE-3 head."""
    from specrt.cli import main
    from specrt.models.eagle3 import save_eagle3_checkpoint, state_dict_of as eagle_state
    from tests.test_eagle3 import random_head
    from tests.tiny_models import save_tiny_bundle_source

    root = tmp_path_factory.mktemp("dflash")
    src = save_tiny_bundle_source("llama", root / "target")
    write_reference_checkpoint(root / "drafter", random_draft(3))
    head = random_head(3)
    save_eagle3_checkpoint(root / "head", head.cfg, eagle_state(head))
    out = root / "bundle"
    assert main(["convert", str(src), "-o", str(out), "--max-context", "96", "--drafter", f"dflash:{root / 'drafter'}",
                 "--drafter", f"eagle3:{root / 'head'}"]) == 0
    return out


def test_bundle_holds_both_drafters_and_the_graph_equals_torch(dflash_bundle):
    from specrt.bundle import load_bundle

    manifest = load_bundle(dflash_bundle)
    entry = manifest.drafter("dflash")
    assert entry.raw["validation"]["max_abs_diff"] < 1e-3  # convert compared the ONNX graph with torch
    assert entry.block_size == 4 and entry.mask_token_id == 96
    assert manifest.drafter("eagle3") is not None
    assert manifest.target.hidden_layers == (0, 1, 2)  # the union of both drafters' layers


@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_dflash_equals_plain(dflash_bundle, adaptive):
    import specrt
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(str(dflash_bundle), device="cpu", drafter="dflash")
    engine.adaptive = adaptive
    params = SamplingParams(max_new_tokens=30, stop_token_ids=())
    for prompt in ("the cat and the dog", "a man in the house of the world", "the world the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        spec = engine.generate(prompt, params).wait()
        assert spec.token_ids == plain.token_ids and spec.stats.drafter == "dflash"
    if not adaptive:
        assert len(spec.stats.acceptance_by_position) >= 1
    draft = engine.drafter.propose(engine.cached_tokens() + [5], 3)
    assert 1 <= len(draft) <= 3 and draft.is_chain()


def test_a_short_draft_runs_the_whole_trained_block(dflash_bundle):
    """Attention inside a block is not causal, so the drafter always runs the block it was trained with and
    cuts the draft afterwards: asking for 1 or 3 tokens gives the same first tokens."""
    import specrt
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(str(dflash_bundle), device="cpu", drafter="dflash")
    engine.generate("the cat and the dog", SamplingParams(max_new_tokens=6, stop_token_ids=())).wait()
    drafter, blocks = engine.drafter, []
    drafter.use_costs(None)  # no confidence cut: the draft length asked for
    run = drafter.session.run
    drafter.session.run = lambda names, feeds: blocks.append(feeds["input_ids"].shape[1]) or run(names, feeds)
    context = engine.cached_tokens() + [5]
    one, three = drafter.propose(context, 1), drafter.propose(context, 3)
    assert blocks == [drafter.block_size, drafter.block_size]
    assert len(one) == 1 and len(three) == 3 and list(three.tokens[:1]) == list(one.tokens)


def test_sampled_dflash_passes_its_q(dflash_bundle):
    import specrt
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(str(dflash_bundle), device="cpu", drafter="dflash")
    engine.generate("the world", SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)).wait()
    engine.drafter.reset(SamplingParams(temperature=1.0), np.random.default_rng(0))
    draft = engine.drafter.propose(engine.cached_tokens() + [5], 3)
    assert draft.probs is not None and draft.probs.shape[0] == len(draft)
    np.testing.assert_allclose(draft.probs.sum(-1), 1.0, rtol=1e-5)
    assert all(draft.probs[i, t] > 0 for i, t in enumerate(draft.tokens))


def test_block_larger_than_the_context_is_refused(tmp_path, capsys):
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    hf = {**DFLASH_HF, "dflash_config": {"target_layer_ids": [0, 2], "block_size": 40, "mask_token_id": 96}}
    model = random_draft(0, hf)
    (tmp_path / "d").mkdir()
    save_file(state_dict_of(model), str(tmp_path / "d" / "model.safetensors"))
    (tmp_path / "d" / "config.json").write_text(json.dumps(hf))
    code = main(["convert", str(src), "-o", str(tmp_path / "o"), "--max-context", "32", "--drafter", f"dflash:{tmp_path / 'd'}"])
    assert code == 2 and "block size 40 does not fit" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_confidence_cut():
    flat = lambda fed: 1.0  # noqa: E731 - verification costs the same for any width
    steep = lambda fed: 1.0 + 0.5 * (fed - 1)  # noqa: E731 - every extra token costs half a call
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)
    assert cut_length([0.9] * 7, flat, 7) == 7  # free verification: keep everything
    assert cut_length([0.9, 0.9, 0.1, 0.1], steep, 4) == 2  # stop where confidence collapses
    for conf in ([0.0] * 5, [1e-6, 0.9, 0.9], [0.01]):  # never below one token: the controller decided to draft
        assert cut_length(conf, steep, len(conf)) == 1
    assert cut_length([0.99] * 7, steep, 3) <= 3  # never above what was asked


def test_training_lowers_the_loss_and_resumes(tmp_path):
    from specrt.train.dflash import DFlashTrainee, train
    from specrt.train.eagle3 import loss_history
    from tests.test_eagle3_train import sequences, tiny_target

    target = tiny_target()
    embed = target.model.embed_tokens.weight.detach().clone()
    lm_head = target.lm_head.weight.detach().clone()

    def fresh(frequent=None):
        return DFlashTrainee(random_draft(5), embed, lm_head, frequent)

    data = sequences(n=16, length=24)
    losses = train(target, fresh(), data, steps=30, folder=tmp_path / "run", lr=3e-3, log=lambda m: None, anchors=4)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    # the same over candidates (every row's top tokens + a few frequent ones) instead of the whole vocabulary
    losses = train(target, fresh(torch.tensor([0, 5, 7])), data, steps=30, folder=tmp_path / "candidates",
                   lr=3e-3, log=lambda m: None, anchors=4)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    whole = fresh()
    whole_losses = train(target, whole, data, steps=6, folder=tmp_path / "whole", log=lambda m: None, save_every=3,
                         anchors=4)

    def interrupt_at_step_5(message):
        if message.startswith("step 5/"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(target, fresh(), data, steps=6, folder=tmp_path / "part", log=interrupt_at_step_5, save_every=3, anchors=4)
    resumed = fresh()
    rest = train(target, resumed, data, steps=6, folder=tmp_path / "part", log=lambda m: None, save_every=3, anchors=4)
    assert len(rest) == 3
    # the checkpoint keeps every step's loss across the interrupt (what the training report lists)
    np.testing.assert_allclose(loss_history(tmp_path / "part"), whole_losses, rtol=1e-4)
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_cached_bundle_with_an_older_shipped_drafter_is_noticed(dflash_bundle, tmp_path):
    """A catalog bundle ships both drafters; either one changing makes the cached bundle stale."""
    import shutil

    from specrt.bundle import load_bundle
    from specrt.app.api import _stale_head

    head, drafter = tmp_path / "head", tmp_path / "drafter"
    shutil.copytree(dflash_bundle.parent / "head", head)
    shutil.copytree(dflash_bundle.parent / "drafter", drafter)
    specs = (f"eagle3:{head}", f"dflash:{drafter}")
    manifest = load_bundle(dflash_bundle, check_hashes=False)
    assert not _stale_head(manifest, specs)
    write_reference_checkpoint(drafter, random_draft(9))  # a newer DFlash drafter
    assert _stale_head(manifest, specs) and not _stale_head(manifest, specs[:1])


def test_position_weights_follow_the_drafters_confidence():
    from specrt.train.dflash import confidence_weights

    q = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.2, 0.9]], requires_grad=True)
    w = confidence_weights(q)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.5, 0.25], [1.0, 1.0, 1.0], [1.0, 0.75, 0.45]]))
    assert not w.requires_grad  # weights, not a path for the gradient


def test_candidate_loss_equals_the_whole_vocabulary_loss_when_it_covers_it():
    from specrt.train.dflash import DFlashTrainee, block_loss, loss_candidates, target_pass
    from tests.test_eagle3_train import tiny_target

    target = tiny_target()
    trainee = DFlashTrainee(random_draft(3), target.model.embed_tokens.weight.detach().clone(),
                            target.lm_head.weight.detach().clone())
    torch.manual_seed(0)
    ids = torch.randint(0, TARGET.vocab_size, (2, 20))
    feats, logits = target_pass(target, ids, trainee.draft.cfg.target_layer_ids)
    anchors = torch.tensor([1, 6, 11])
    whole = block_loss(trainee, ids[0], feats[0], logits[0], anchors)
    every = block_loss(trainee, ids[0], feats[0], logits[0], anchors, torch.arange(TARGET.vocab_size))
    torch.testing.assert_close(whole[0], every[0])
    assert whole[1] == every[1]
    some = loss_candidates(logits, torch.tensor([90, 3]), top=2)
    assert torch.equal(some, torch.unique(some)) and {3, 90} <= set(some.tolist())
    assert set(logits.argmax(-1).flatten().tolist()) <= set(some.tolist())  # every row's target token
    assert len(some) < TARGET.vocab_size
    assert loss_candidates(logits, None) is None


@pytest.mark.parametrize("warmup", [0, 10])
def test_warm_up_scales_the_first_steps(tmp_path, warmup):
    """The shared loop's warm-up (the DFlash trainer uses 20 steps): Adam's first step moves each weight by
    about lr, so with a warm-up of 10 it moves by about lr / 10."""
    from specrt.train.eagle3 import train_loop
    from tests.test_eagle3_train import sequences, tiny_target

    torch.manual_seed(0)
    module = torch.nn.Linear(4, 4)
    before = module.weight.detach().clone()
    x = torch.randn(8, 4)
    train_loop(tiny_target(), module, sequences(n=4, length=8), 1, tmp_path / "run",
               lambda ids, rng: (module(x).pow(2).sum(), [0.0]), lambda agree: "", lr=1e-2, log=lambda m: None,
               warmup=warmup, clip=1.0)
    moved = (module.weight.detach() - before).abs().max().item()
    assert moved == pytest.approx(1e-2 if warmup == 0 else 1e-3, rel=0.05)


def test_train_drafter_dflash_writes_a_draft_vocabulary_that_drafts_losslessly(tmp_path, capsys):
    """specrt train-drafter --kind dflash: the checkpoint restricts the drafter to the --draft-vocab most frequent
    tokens (d2t); convert keeps only those lm_head rows, and the drafter proposes only those tokens (greedy and
    sampled), losslessly."""
    import specrt
    from specrt.bundle import load_bundle
    from specrt.cli import main
    from specrt.runtime.sampling import SamplingParams
    from tests.test_eagle3_train import write_conversations
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    write_conversations(tmp_path / "data.jsonl")
    out = tmp_path / "dflash"
    code = main(["train-drafter", str(src), "--kind", "dflash", "--data", str(tmp_path / "data.jsonl"), "--out",
                 str(out), "--max-tokens", "1500", "--epochs", "1", "--seq-len", "64", "--block-size", "4",
                 "--draft-vocab", "40"])
    assert code == 0, capsys.readouterr().err
    cfg, tensors = load_dflash_checkpoint(out, TARGET)
    vocab = np.arange(40) + tensors["d2t"]  # the 40 target ids the drafter may propose
    assert len(np.unique(vocab)) == 40 and vocab.max() < TARGET.vocab_size
    bundle = tmp_path / "bundle"
    assert main(["convert", str(src), "-o", str(bundle), "--max-context", "96", "--drafter", f"dflash:{out}"]) == 0
    entry = load_bundle(bundle).drafter("dflash")
    assert entry.raw["draft_vocab_size"] == 40 and entry.raw["validation"]["max_abs_diff"] < 1e-3
    engine = specrt.load(str(bundle), device="cpu", drafter="dflash")
    engine.adaptive = False
    params = SamplingParams(max_new_tokens=30, stop_token_ids=())
    for prompt in ("the cat and the dog", "a man in the house of the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids
    context = engine.cached_tokens() + [5]
    assert set(engine.drafter.propose(context, 3).tokens) <= set(vocab.tolist())
    engine.drafter.reset(SamplingParams(temperature=1.0), np.random.default_rng(0))
    draft = engine.drafter.propose(context, 3)
    outside = np.setdiff1d(np.arange(TARGET.vocab_size), vocab)
    assert draft.probs.shape[1] == TARGET.vocab_size and np.all(draft.probs[:, outside] == 0)
    np.testing.assert_allclose(draft.probs.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("ids, message", [([3, 3, 5], "not increasing"), ([0, 1, 500], "outside the target")])
def test_bad_draft_vocabulary_is_named(tmp_path, ids, message):
    from specrt.models.dflash import d2t_for

    model = random_draft()
    write_reference_checkpoint(tmp_path, model)
    save_file({**state_dict_of(model), "d2t": d2t_for(np.array(ids))}, str(tmp_path / "model.safetensors"))
    with pytest.raises(SourceError, match=message):
        load_dflash_checkpoint(tmp_path, TARGET)
