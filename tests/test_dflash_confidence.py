"""The DFlash confidence head (models/dflash_confidence.py, train/confidence.py): the graph's accept_logits equal
the torch formula, the fit learns what the draft probability misses, a bad head file is named, the drafter takes
dflash:prob / dflash:head, and both cuts draft losslessly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specrt.errors import SourceError, SpecrtError
from specrt.models.dflash_confidence import (
    accept_logits, confidence_path, load_confidence_head, log_max_prob, save_confidence_head,
)
from tests.test_dflash import DFLASH_HF, random_draft, write_reference_checkpoint
from tests.test_eagle3 import TARGET

HIDDEN, BLOCK = DFLASH_HF["hidden_size"], DFLASH_HF["dflash_config"]["block_size"]


def random_head(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"weight": rng.normal(size=HIDDEN).astype(np.float32) * 0.3,
            "bias": rng.normal(size=BLOCK - 1).astype(np.float32),
            "prob_scale": rng.uniform(0.5, 2.0, BLOCK - 1).astype(np.float32)}


def test_log_max_prob_numpy_and_torch_agree():
    logits = np.random.default_rng(0).normal(size=(3, 5, 11)).astype(np.float32) * 4
    want = np.log(np.exp(logits).max(-1) / np.exp(logits).sum(-1))
    np.testing.assert_allclose(log_max_prob(logits), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(log_max_prob(torch.from_numpy(logits)).numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def headed_bundle(tmp_path_factory):
    """A tiny target converted with a random DFlash drafter that carries a random confidence head."""
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    root = tmp_path_factory.mktemp("dflash_head")
    src = save_tiny_bundle_source("llama", root / "target")
    model = random_draft(5)
    write_reference_checkpoint(root / "drafter", model)
    save_confidence_head(root / "drafter", random_head(1))
    out = root / "bundle"
    assert main(["convert", str(src), "-o", str(out), "--max-context", "96", "--drafter", f"dflash:{root / 'drafter'}"]) == 0
    return out, model, root


def test_the_graph_computes_the_heads_formula(headed_bundle):
    """accept_logits from the ONNX graph = the formula on the torch drafter's hidden states and logits (for a
    whole block and for a block shortened by the context's end)."""
    import onnxruntime as ort

    from specrt.bundle import load_bundle
    from specrt.convert.dflash_graph import io_names

    bundle, model, _ = headed_bundle
    entry = load_bundle(bundle).drafter("dflash")
    assert entry.raw["graph"]["outputs"] == ["logits", "accept_logits"]
    assert entry.raw["validation"]["max_abs_diff"] < 1e-3
    session = ort.InferenceSession(str(bundle / entry.graph.file), providers=["CPUExecutionProvider"])
    cfg, head = model.cfg, random_head(1)
    rng = np.random.default_rng(2)
    embed, lm_head = target_tables(bundle.parent / "target")
    for block in (BLOCK, 2):
        ids = np.array([[7] + [cfg.mask_token_id] * (block - 1)])
        feats = rng.normal(size=(1, 3, cfg.feature_width)).astype(np.float32)
        pos = np.arange(3 + block)[None]
        names, _ = io_names(cfg.layers.num_layers)
        empty = np.zeros((1, cfg.layers.num_kv_heads, 0, cfg.layers.head_dim), np.float32)
        outs = session.run(None, dict(zip(names, [ids, feats, pos, *[empty] * (2 * cfg.layers.num_layers)])))
        with torch.no_grad():
            hidden, _ = model(torch.from_numpy(feats), torch.from_numpy(embed[ids]), torch.from_numpy(pos[:, :3]),
                              torch.from_numpy(pos[:, 3:]), model.empty_cache(1))
            masked = hidden[:, 1:]  # [1, block - 1, H]
            logits = masked @ torch.from_numpy(lm_head).t()
        want = accept_logits(masked.numpy(), logits.numpy(), head)
        assert outs[-1].shape == (1, block - 1)
        np.testing.assert_allclose(outs[-1], want, rtol=1e-4, atol=1e-4)


def target_tables(source) -> tuple[np.ndarray, np.ndarray]:
    """The tiny target's embedding table and lm_head [V, H]."""
    from specrt.convert import sources

    w = sources.load(sources.resolve(str(source), log=lambda m: None)).weights
    return (np.asarray(w["model.embed_tokens.weight"], np.float32), np.asarray(w["lm_head.weight"], np.float32))


@pytest.mark.parametrize("mode", ["dflash", "dflash:head", "dflash:prob"])
def test_both_cuts_draft_losslessly(headed_bundle, mode):
    import specrt
    from specrt.runtime.sampling import SamplingParams

    bundle, _, _ = headed_bundle
    engine = specrt.load(str(bundle), device="cpu", drafter=mode)
    assert engine.drafter.cut == ("prob" if mode == "dflash:prob" else "head") and engine.drafter.name == mode
    engine.adaptive = True  # the controller's length, then the cut by the chosen confidence
    params = SamplingParams(max_new_tokens=30, stop_token_ids=())
    for prompt in ("the cat and the dog", "a man in the house of the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids


def test_the_head_sets_the_confidence_the_cut_reads(headed_bundle):
    """dflash:head cuts by sigmoid(accept_logits), dflash:prob by the draft's top probability."""
    import specrt

    bundle, _, _ = headed_bundle
    engine = specrt.load(str(bundle), device="cpu", drafter="dflash:head")
    drafter = engine.drafter
    engine.generate("the cat", specrt_params()).wait()
    seen = {}
    import specrt.drafters.dflash.drafter as module

    original = module.cut_length
    module.cut_length = lambda confidence, seconds, k: seen.setdefault(drafter.cut, list(confidence)) and 1
    try:
        drafter.use_costs(lambda fed: 1.0)
        context = engine.cached_tokens() + [5]
        for cut in ("head", "prob"):
            drafter.use_mode(cut)
            drafter.propose(context, 3)
    finally:
        module.cut_length = original
    run = drafter.session.run(None, last_feeds(drafter, context))
    np.testing.assert_allclose(seen["head"], 1 / (1 + np.exp(-run[-1][0])), rtol=1e-5)
    logits = run[0][0]
    np.testing.assert_allclose(seen["prob"], np.exp(log_max_prob(logits)), rtol=1e-4)
    assert not np.allclose(seen["head"], seen["prob"])


def specrt_params():
    from specrt.runtime.sampling import SamplingParams

    return SamplingParams(max_new_tokens=4, stop_token_ids=())


def last_feeds(drafter, context):
    """The feeds of a fresh drafter call over the whole context (no cache)."""
    n = len(context) - 1
    feats = drafter.target.features(0, n, drafter.columns)[None].astype(np.float32)
    ids = np.array([[context[n]] + [drafter.mask] * (drafter.block_size - 1)], dtype=np.int64)
    pos = np.arange(0, n + drafter.block_size, dtype=np.int64)[None]
    empty = np.zeros((1, drafter.kv_heads, 0, drafter.head_dim), np.float32)
    names = ["input_ids", "features", "position_ids"] + [
        f"past_key_values.{i}.{kv}" for i in range(drafter.layers) for kv in ("key", "value")]
    return dict(zip(names, [ids, feats, pos, *[empty] * (2 * drafter.layers)]))


def test_modes_are_checked(headed_bundle, tmp_path):
    import specrt
    from specrt.app.api import check_drafter_name
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    with pytest.raises(SpecrtError, match="dflash takes :prob or :head"):
        check_drafter_name("dflash:tree")
    with pytest.raises(SpecrtError, match="take :tree or :chain"):
        check_drafter_name("eagle3:prob")
    check_drafter_name("dflash:prob+ngram")
    # a drafter without a head: dflash:prob works, dflash:head is a clear error
    write_reference_checkpoint(tmp_path / "plain", random_draft(5))
    src = save_tiny_bundle_source("llama", tmp_path / "target")
    assert main(["convert", str(src), "-o", str(tmp_path / "b"), "--max-context", "96",
                 "--drafter", f"dflash:{tmp_path / 'plain'}"]) == 0
    assert specrt.load(str(tmp_path / "b"), device="cpu", drafter="dflash").drafter.cut == "prob"
    with pytest.raises(SpecrtError, match="has no confidence head"):
        specrt.load(str(tmp_path / "b"), device="cpu", drafter="dflash:head")


@pytest.mark.parametrize("change, message", [
    (lambda h: {**h, "extra": np.zeros(2, np.float32)}, "holds weight, bias, prob_scale"),
    (lambda h: {**h, "bias": np.zeros(BLOCK, np.float32)}, "bias has shape"),
])
def test_a_bad_head_file_is_named(tmp_path, change, message):
    from safetensors.numpy import save_file

    confidence_path(tmp_path).parent.mkdir(parents=True)
    save_file(change(random_head()), str(confidence_path(tmp_path)))
    with pytest.raises(SourceError, match=message):
        load_confidence_head(tmp_path, HIDDEN, BLOCK)
    assert load_confidence_head(tmp_path / "none", HIDDEN, BLOCK) is None


def test_a_changed_head_marks_the_checkpoint_changed(tmp_path):
    from specrt.bundle import checkpoint_sha256

    write_reference_checkpoint(tmp_path, random_draft(0))
    before = checkpoint_sha256(tmp_path)
    save_confidence_head(tmp_path, random_head(0))
    with_head = checkpoint_sha256(tmp_path)
    save_confidence_head(tmp_path, random_head(1))
    assert len({before, with_head, checkpoint_sha256(tmp_path)}) == 3


def test_the_fit_learns_what_the_draft_probability_misses():
    """Acceptance depends on a direction of the hidden state the draft's probability does not see: the fitted
    head's held-out log-loss is well below the draft probability's, its estimates match the observed rates, and
    positions past a miss do not count."""
    from specrt.train.confidence import fit, held_back_report

    def examples(seed, n=4000, positions=3):
        g = torch.Generator().manual_seed(seed)
        hidden = torch.randn(n, positions, 8, generator=g)
        log_top = torch.log(torch.rand(n, positions, generator=g).clamp(0.05, 0.95))
        agree = (torch.sigmoid(3 * hidden[..., 0]) > torch.rand(n, positions, generator=g)).float()
        ones = torch.ones(n, 1)
        reached = torch.cumprod(torch.cat((ones, agree[:, :-1]), 1), 1)
        return {"hidden": hidden, "log_top": log_top, "agree": agree, "reached": reached}

    head = fit(examples(0))
    report = held_back_report(head, examples(1))
    assert report["log_loss_head"] < 0.75 * report["log_loss_draft_probability"]
    np.testing.assert_allclose(report["head_estimate_by_position"], report["accepted_by_position"], atol=0.05)
    assert abs(head["weight"][0]) > 5 * np.abs(head["weight"][1:]).max()
    # an example past a miss weighs nothing: flipping its label leaves the fit unchanged
    data = examples(0)
    flipped = dict(data, agree=torch.where(data["reached"] == 0, 1 - data["agree"], data["agree"]))
    flipped["reached"] = data["reached"]
    again = fit(flipped)
    np.testing.assert_allclose(again["weight"], head["weight"], atol=1e-5)


def test_train_drafter_writes_a_head_that_converts(tmp_path, capsys):
    """specrt train-drafter --kind dflash fits the head after the drafter, scores it, and convert puts it in the
    graph (validated); --init with more --layers starts from the given drafter's outputs exactly."""
    from specrt.bundle import load_bundle
    from specrt.cli import main
    from tests.test_eagle3_train import write_conversations
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    write_conversations(tmp_path / "data.jsonl")
    out = tmp_path / "dflash"
    args = ["train-drafter", str(src), "--kind", "dflash", "--data", str(tmp_path / "data.jsonl"), "--max-tokens",
            "1500", "--epochs", "1", "--seq-len", "64", "--block-size", "4", "--draft-vocab", "40"]
    assert main(args + ["--out", str(out), "--precision", "bf16"]) == 0, capsys.readouterr().err
    report = json.loads((out / "training_report.json").read_text())["confidence_head"]
    assert report["reached_by_position"][0] > 0 and len(report["accepted_by_position"]) == 3
    assert load_confidence_head(out, HIDDEN, 4) is not None
    assert main(["convert", str(src), "-o", str(tmp_path / "b"), "--max-context", "96", "--drafter", f"dflash:{out}"]) == 0
    entry = load_bundle(tmp_path / "b").drafter("dflash")
    assert "accept_logits" in entry.raw["graph"]["outputs"] and entry.raw["validation"]["max_abs_diff"] < 1e-3


def test_init_grows_a_drafter_that_starts_where_the_given_one_is(tmp_path):
    from specrt.convert import sources
    from specrt.train.recipe import _dflash_trainee
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    loaded = sources.load(sources.resolve(str(src), log=lambda m: None))
    counts = np.ones(TARGET.vocab_size)
    grown_cfg = _dflash_trainee(loaded, BLOCK, counts, layers=2).draft.cfg
    hf = {**DFLASH_HF, "num_hidden_layers": 1,
          "dflash_config": {**DFLASH_HF["dflash_config"], "target_layer_ids": list(grown_cfg.target_layer_ids)}}
    base = random_draft(0, hf)
    write_reference_checkpoint(tmp_path / "base", base)
    (tmp_path / "base" / "config.json").write_text(json.dumps(hf))
    grown = _dflash_trainee(loaded, BLOCK, counts, layers=2, init=tmp_path / "base").draft
    assert len(grown.layers) == 2 and grown.cfg.mask_token_id == base.cfg.mask_token_id
    feats = torch.randn(1, 5, base.cfg.feature_width)
    block = torch.randn(1, BLOCK, HIDDEN)
    pos, bpos = torch.arange(5)[None], torch.arange(5, 5 + BLOCK)[None]
    with torch.no_grad():
        want, _ = base(feats, block, pos, bpos, base.empty_cache(1))
        got, _ = grown(feats, block, pos, bpos, grown.empty_cache(1))
    torch.testing.assert_close(got, want)
    with pytest.raises(SpecrtError, match="block size"):
        _dflash_trainee(loaded, BLOCK + 1, counts, layers=2, init=tmp_path / "base")
