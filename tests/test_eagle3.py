"""The EAGLE-3 head's torch definition and its vLLM/SGLang checkpoint layout, on tiny random weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from specrt.errors import SourceError
from specrt.models.config import config_from_hf
from specrt.models.eagle3 import (
    Eagle3Draft, default_aux_layers, eagle3_config_from_hf, load_eagle3_checkpoint, model_from_tensors,
    save_eagle3_checkpoint, state_dict_of,
)
from tests.tiny_models import COMMON

TARGET = config_from_hf({**COMMON, "model_type": "llama", "rope_theta": 10000.0})
# reads the outputs of layers 2, 1, 0 of the 3-layer target: HF hidden_states[3, 2, 1], as vLLM's top-level list says
HEAD_HF = {**COMMON, "num_hidden_layers": 1, "draft_vocab_size": 40, "rope_theta": 10000.0,
           "eagle_aux_hidden_state_layer_ids": [3, 2, 1]}


def random_head(seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    model = Eagle3Draft(eagle3_config_from_hf(HEAD_HF, TARGET)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        # draft ids map to a spread of target ids (d2t holds offsets: target = d + d2t[d])
        model.d2t.copy_(torch.from_numpy(np.sort(np.random.default_rng(seed).choice(97, 40, replace=False))) - torch.arange(40))
    return model


def test_default_aux_layers_follow_eagle():
    assert default_aux_layers(30) == (2, 15, 27)  # what specrt's trainer reads: outputs of layers 2, 15, 27
    # a config without ids means EAGLE's default, HF hidden_states[2, 1, 1] of a 3-layer target: layer outputs 1, 0, 0
    no_ids = {k: v for k, v in HEAD_HF.items() if k != "eagle_aux_hidden_state_layer_ids"}
    assert eagle3_config_from_hf(no_ids, TARGET).aux_layers == (1, 0, 0)
    assert eagle3_config_from_hf(HEAD_HF, TARGET).aux_layers == (2, 1, 0)


@pytest.mark.parametrize("layout", ["midlayer", "layers.0"])
def test_checkpoint_round_trip_and_forward(tmp_path, layout):
    head = random_head()
    save_eagle3_checkpoint(tmp_path, head.cfg, state_dict_of(head))
    if layout == "layers.0":  # SGLang/vLLM also accept layers.0.* names
        path = tmp_path / "model.safetensors"
        tensors = load_file(str(path))
        save_file({k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}, str(path))
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLMEagle3"] and hf["draft_vocab_size"] == 40
    cfg, tensors = load_eagle3_checkpoint(tmp_path, TARGET)
    for name, value in state_dict_of(head).items():
        np.testing.assert_array_equal(tensors[name], value)
    assert tensors["t2d"].sum() == 40 and tensors["t2d"][head.target_ids().numpy()].all()
    loaded = model_from_tensors(cfg, tensors)
    emb, feats = torch.randn(1, 5, 64), torch.randn(1, 5, 3 * 64)
    pos = torch.arange(5)[None]
    empty = torch.zeros(1, 2, 0, 16)
    with torch.no_grad():
        a = head(emb, head.fuse(feats), pos, empty, empty)
        b = loaded(emb, loaded.fuse(feats), pos, empty, empty)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert a[0].shape == (1, 5, 40) and a[1].shape == (1, 5, 64)


def test_incremental_steps_equal_one_call():
    """Feeding tokens one at a time through the head's own KV cache equals one call over all of them."""
    head = random_head(1)
    emb, hidden = torch.randn(1, 6, 64), torch.randn(1, 6, 64)
    pos = torch.arange(6)[None]
    with torch.no_grad():
        full_logits, full_h, _, _ = head(emb, hidden, pos, torch.zeros(1, 2, 0, 16), torch.zeros(1, 2, 0, 16))
        k = v = torch.zeros(1, 2, 0, 16)
        for i in range(6):
            logits, h, nk, nv = head(emb[:, i:i + 1], hidden[:, i:i + 1], pos[:, i:i + 1], k, v)
            k, v = torch.cat((k, nk), 2), torch.cat((v, nv), 2)
            torch.testing.assert_close(logits[:, 0], full_logits[:, i], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(h[:, 0], full_h[:, i], rtol=1e-5, atol=1e-5)


def _write(tmp_path, head, hf_changes=None, drop=None, add=None, d2t=None):
    tensors = state_dict_of(head)
    if drop:
        tensors.pop(drop)
    if add:
        tensors[add] = np.zeros(3, np.float32)
    if d2t is not None:
        tensors["d2t"] = d2t
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**head.cfg.to_hf(), **(hf_changes or {})}))


@pytest.mark.parametrize("kwargs, message", [
    (dict(drop="midlayer.hidden_norm.weight"), "lacks tensor midlayer.hidden_norm.weight"),
    (dict(add="midlayer.extra.weight"), "unexpected tensor midlayer.extra.weight"),
    (dict(d2t=np.full(40, 90, dtype=np.int64)), "d2t maps draft id 7 to target id 97"),
    (dict(hf_changes={"target_hidden_size": 128}), "reads hidden size 128, the target has 64"),
    (dict(hf_changes={"vocab_size": 151936}), "vocabulary 151936, the target has 97"),
    (dict(hf_changes={"eagle_aux_hidden_state_layer_ids": [2, 3, 31],
                      "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 30]}}),
     "[2, 3, 31] names layers outside the target's 3"),
    # the eagle_config list alone: vLLM and SGLang read different layers from it, specrt refuses to guess
    (dict(hf_changes={"eagle_aux_hidden_state_layer_ids": None,
                      "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 1, 0]}}), "alone is ambiguous"),
])
def test_bad_checkpoints_are_named(tmp_path, kwargs, message):
    _write(tmp_path, random_head(), **kwargs)
    with pytest.raises(SourceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_eagle3_checkpoint(tmp_path, TARGET)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(random_head().cfg.to_hf()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(SourceError, match="pytorch_model.bin is a pickle file"):
        load_eagle3_checkpoint(tmp_path, TARGET)


def test_onnx_graph_equals_torch_over_steps():
    """The exported head (fused ORT operators, own KV cache) equals its torch definition: a 4-token call
    from target features, then two single-token steps that feed back the head's own hidden output."""
    import onnxruntime as ort

    from specrt.convert.eagle3_graph import build_eagle3_graph
    from specrt.convert.head_graph import compare_with_torch
    from specrt.convert.target_graph import GraphOptions

    head = random_head(2)
    embed = np.random.default_rng(0).normal(size=(97, 64)).astype(np.float32)
    model = build_eagle3_graph(head.cfg, state_dict_of(head), embed, GraphOptions(max_context=32))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert compare_with_torch(sess, head, embed) < 1e-4
    assert sess.get_outputs()[0].shape[-1] == 40  # logits over the draft vocabulary


@pytest.fixture(scope="module")
def eagle_bundle(tmp_path_factory):
    """A tiny target converted with a random EAGLE-3 head (checkpoint in the vLLM layout) as its drafter."""
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    root = tmp_path_factory.mktemp("eagle")
    src = save_tiny_bundle_source("llama", root / "target")
    head = random_head(3)
    head_dir = root / "head"
    save_eagle3_checkpoint(head_dir, head.cfg, state_dict_of(head))
    out = root / "bundle"
    assert main(["convert", str(src), "-o", str(out), "--max-context", "96", "--drafter", f"eagle3:{head_dir}"]) == 0
    return out


def test_eagle3_bundle_and_lossless_drafting(eagle_bundle):
    import specrt
    from specrt.bundle import load_bundle
    from specrt.runtime.sampling import SamplingParams

    manifest = load_bundle(eagle_bundle)
    entry = manifest.drafter("eagle3")
    assert entry.aux_layers == (2, 1, 0) and manifest.target.hidden_layers == (0, 1, 2)
    assert entry.raw["validation"]["max_abs_diff"] < 1e-3 and "eagle3.d2t.safetensors" in manifest.files
    engine = specrt.load(str(eagle_bundle), device="cpu", drafter="eagle3")
    engine.adaptive = False
    params = SamplingParams(max_new_tokens=30, stop_token_ids=())
    for prompt in ("the cat and the dog", "a man in the house of the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        spec = engine.generate(prompt, params).wait()
        assert spec.token_ids == plain.token_ids and spec.stats.drafter == "eagle3"
        assert len(spec.stats.acceptance_by_position) == 4  # it drafted 4 deep every call
    draft = engine.drafter.propose(engine.cached_tokens() + [5], 3)
    assert set(draft.tokens.tolist()) <= set(engine.drafter.d2t_targets.tolist())  # only mapped target ids
    sampled = engine.generate("the world", SamplingParams(max_new_tokens=10, temperature=1.0, seed=1)).wait()
    assert len(sampled.token_ids) > 0


def test_eagle3_for_another_target_is_refused(tmp_path, capsys):
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    head = random_head()
    hf = head.cfg.to_hf()
    save_eagle3_checkpoint(tmp_path / "head", head.cfg, state_dict_of(head))
    (tmp_path / "head" / "config.json").write_text(json.dumps({**hf, "target_hidden_size": 32}))
    code = main(["convert", str(src), "-o", str(tmp_path / "out"), "--drafter", f"eagle3:{tmp_path / 'head'}"])
    assert code == 2 and "reads hidden size 32, the target has 64" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_half_precision_checkpoint_loads_and_runs(tmp_path):
    head = random_head(4)
    save_eagle3_checkpoint(tmp_path, head.cfg, state_dict_of(head), half=True)
    cfg, tensors = load_eagle3_checkpoint(tmp_path, TARGET)
    assert tensors["fc.weight"].dtype == np.float16 and tensors["d2t"].dtype == np.int64
    loaded = model_from_tensors(cfg, tensors)
    x = torch.randn(1, 3, 64)
    empty = torch.zeros(1, 2, 0, 16)
    with torch.no_grad():
        a = head(x, x, torch.arange(3)[None], empty, empty)[0]
        b = loaded(x, x, torch.arange(3)[None], empty, empty)[0]
    torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)  # fp16 rounding of the weights only


def test_auto_drafter_and_drafter_names(eagle_bundle, tmp_path):
    import specrt
    from specrt.errors import SpecrtError

    assert specrt.load(str(eagle_bundle), device="cpu", drafter="auto").drafter.name == "eagle3+ngram+ngram:pool"
    tree = specrt.load(str(eagle_bundle), device="cpu", drafter="eagle3:tree").drafter
    assert tree.name == "eagle3:tree" and tree.topk > 1 and tree.max_draft > 4
    for name, message in (("ngram:tree", "only eagle3, mtp take"), ("eagle3:wide", "only eagle3, mtp take"),
                          ("ngram:wide", "ngram takes :history"), ("dflash", "has no DFlash drafter"),
                          ("magic", "unknown")):
        with pytest.raises(SpecrtError, match=message):
            specrt.load(str(eagle_bundle), device="cpu", drafter=name)


def test_cached_bundle_with_an_older_head_is_noticed(eagle_bundle, tmp_path):
    """A catalog bundle is converted again when the head shipped now differs from the one it was built with."""
    import shutil

    from specrt.bundle import load_bundle
    from specrt.app.api import _stale_head

    head = tmp_path / "head"
    shutil.copytree(eagle_bundle.parent / "head", head)
    manifest = load_bundle(eagle_bundle, check_hashes=False)
    assert not _stale_head(manifest, f"eagle3:{head}") and not _stale_head(manifest, None)
    head_now = random_head(5)  # a newer head
    save_eagle3_checkpoint(head, head_now.cfg, state_dict_of(head_now))
    assert _stale_head(manifest, f"eagle3:{head}")
