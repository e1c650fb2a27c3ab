"""MTP modules inside a target's own checkpoint, in the DeepSeek-V3/GLM-4.5, Qwen3-Next and MiMo layouts: tiny
random checkpoints are found, checked, converted with `--drafter mtp` (graph validated against torch) and
draft losslessly, chained and as a tree."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from specrt.errors import SourceError
from specrt.models.config import config_from_hf
from specrt.models.hf_loader import load_hf_weights
from specrt.models.mtp import LAYOUTS, MtpConfig, MtpModule, block_config, load_mtp_from_target, mtp_tensor_names
from tests.tiny_models import read_config, save_tiny_bundle_source

# layout -> (the target architecture it ships with here, model_type written into config.json)
TARGETS = {"deepseek": ("llama", "llama"), "qwen3_next": ("qwen3", "qwen3"), "mimo": ("qwen2", "mimo")}


def _layout(name: str):
    return next(lay for lay in LAYOUTS if lay.name == name)


def random_mtp_tensors(layout_name: str, target_cfg, seed: int = 0, own_head: bool = False) -> dict[str, np.ndarray]:
    """A random MTP module's tensors under the layout's checkpoint names."""
    import dataclasses

    torch.manual_seed(seed)
    cfg = MtpConfig(block_config(target_cfg), _layout(layout_name), own_head)
    module = MtpModule(cfg)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    state = {k: v.numpy() for k, v in module.state_dict().items()}
    names = mtp_tensor_names(cfg.layout, target_cfg)
    out = {names[k]: state[k] for k in names}
    if own_head:
        out[f"model.layers.{target_cfg.num_layers}.shared_head.head.weight"] = state["head.weight"]
    if layout_name == "qwen3_next":  # Qwen3-Next writes its module at the top level: mtp.*
        out = {k[len("model."):]: v for k, v in out.items()}
    return out


def make_target(root, layout_name: str, seed: int = 0, own_head: bool = False, edit=None):
    arch, model_type = TARGETS[layout_name]
    src = save_tiny_bundle_source(arch, root, seed)
    hf = read_config(src)
    hf["model_type"] = model_type
    (src / "config.json").write_text(json.dumps(hf))
    tensors = random_mtp_tensors(layout_name, config_from_hf(hf), seed + 1, own_head)
    if edit:
        tensors = edit(tensors)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(src / "mtp.safetensors"))
    return src


@pytest.mark.parametrize("layout", ["deepseek", "qwen3_next", "mimo"])
def test_module_is_found_in_each_layout(tmp_path, layout):
    src = make_target(tmp_path, layout, own_head=layout == "deepseek")
    target = config_from_hf(read_config(src))
    weights = load_hf_weights(src)
    cfg, tensors = load_mtp_from_target(target, weights)
    assert cfg.layout.name == layout and cfg.own_head == (layout == "deepseek")
    written = random_mtp_tensors(layout, target, 1, own_head=layout == "deepseek")
    enorm = [v for k, v in written.items() if k.endswith(("enorm.weight", "pre_fc_norm_embedding.weight", "token_layernorm.weight"))]
    np.testing.assert_array_equal(tensors["enorm.weight"], enorm[0])
    if layout != "deepseek":  # the target's own lm_head serves
        np.testing.assert_array_equal(tensors["head.weight"], weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
    np.testing.assert_array_equal(tensors["target_norm.weight"], weights["model.norm.weight"])


def test_concat_order_follows_the_layout():
    """MiMo concatenates [hidden, embedding], the others [embedding, hidden]: swapping the halves of proj's input
    columns turns one into the other."""
    import dataclasses

    target = config_from_hf({**read_config_like("llama")})
    layer = dataclasses.replace(target, num_layers=1)
    torch.manual_seed(0)
    a = MtpModule(MtpConfig(layer, _layout("qwen3_next"), False)).eval()
    b = MtpModule(MtpConfig(layer, dataclasses.replace(_layout("qwen3_next"), hidden_first=True), False)).eval()
    b.load_state_dict(a.state_dict())
    h = target.hidden_size
    with torch.no_grad():
        b.proj.weight.copy_(torch.cat((a.proj.weight[:, h:], a.proj.weight[:, :h]), dim=1))
        e, hid, pos = torch.randn(1, 3, h), torch.randn(1, 3, h), torch.arange(3)[None]
        empty = torch.zeros(1, target.num_kv_heads, 0, target.head_dim)
        torch.testing.assert_close(a(e, hid, pos, empty, empty)[0], b(e, hid, pos, empty, empty)[0])


def read_config_like(arch: str) -> dict:
    from tests.tiny_models import hf_config

    return hf_config(arch).to_dict()


def _drop(suffix):
    return lambda t: {k: v for k, v in t.items() if not k.endswith(suffix)}


@pytest.mark.parametrize("layout, edit, message", [
    ("deepseek", _drop("hnorm.weight"), "lacks tensor model.layers.3.hnorm.weight"),
    ("mimo", _drop("mlp.down_proj.weight"), "lacks tensor model.mtp_layers.0.mlp.down_proj.weight"),
    ("qwen3_next", lambda t: {**t, "mtp.extra_gate.weight": np.zeros(3, np.float32)},
     "unexpected tensor model.mtp.extra_gate.weight"),
    ("deepseek", lambda t: {k: (v[:, :64] if k.endswith("eh_proj.weight") else v) for k, v in t.items()},
     "eh_proj.weight has shape (64, 64), expected (64, 128)"),
])
def test_bad_modules_are_named(tmp_path, layout, edit, message):
    src = make_target(tmp_path, layout, edit=edit)
    with pytest.raises(SourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_mtp_from_target(config_from_hf(read_config(src)), load_hf_weights(src))


@pytest.fixture(scope="module")
def mtp_bundles(tmp_path_factory):
    from specrt.cli import main

    root = tmp_path_factory.mktemp("mtp")
    out = {}
    for i, layout in enumerate(("deepseek", "qwen3_next", "mimo")):
        src = make_target(root / f"{layout}-src", layout, seed=10 + i, own_head=layout == "deepseek")
        out[layout] = root / layout
        assert main(["convert", str(src), "-o", str(out[layout]), "--max-context", "96", "--drafter", "mtp"]) == 0
    return out


@pytest.mark.parametrize("layout", ["deepseek", "qwen3_next", "mimo"])
def test_mtp_bundle_drafts_losslessly_chain_and_tree(mtp_bundles, layout):
    import specrt
    from specrt.bundle import load_bundle
    from specrt.runtime.sampling import SamplingParams

    manifest = load_bundle(mtp_bundles[layout])
    entry = manifest.drafter("mtp")
    assert entry.raw["layout"] == layout and entry.raw["validation"]["max_abs_diff"] < 1e-3
    assert manifest.target.hidden_layers == (2,)  # the residual stream after the last layer
    engine = specrt.load(str(mtp_bundles[layout]), device="cpu", drafter="mtp")
    engine.adaptive = False
    params = SamplingParams(max_new_tokens=24, stop_token_ids=())
    drafts = []
    propose = engine.drafter.propose
    engine.drafter.propose = lambda context, k: drafts.append(propose(context, k)) or drafts[-1]
    for topk in (1, 3):
        engine.drafter.topk = topk
        drafts.clear()
        for prompt in ("the cat and the dog", "a man in the house of the world"):
            plain = engine.generate(prompt, params, drafter=None).wait()
            spec = engine.generate(prompt, params).wait()
            assert spec.token_ids == plain.token_ids and spec.stats.drafter == "mtp"
            assert spec.stats.acceptance_by_position  # it drafted
        assert all(d.is_chain() for d in drafts) == (topk == 1)  # trees when topk > 1
    engine.drafter.topk = 3
    sampled = engine.generate("the world", SamplingParams(max_new_tokens=12, temperature=1.0, seed=1)).wait()
    assert len(sampled.token_ids) == 12 and any(not d.is_chain() for d in drafts)  # sampled verification of trees
    draft = engine.drafter.propose(engine.cached_tokens() + [5], 6)
    assert len(draft) == 6 and draft.parents[0] == -1 and (draft.parents < np.arange(6)).all()
    assert len(set(draft.tokens[draft.parents == -1].tolist())) == (draft.parents == -1).sum()  # distinct siblings


def test_gguf_target_or_no_module_is_refused(tmp_path, capsys):
    from specrt.cli import main

    src = save_tiny_bundle_source("llama", tmp_path / "plain")
    code = main(["convert", str(src), "-o", str(tmp_path / "out"), "--drafter", "mtp"])
    assert code == 2 and "has no MTP module" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_train_drafter_mtp_for_a_target_without_one(tmp_path, capsys):
    """specrt train-drafter --kind mtp: the loss falls, the module is written in the DeepSeek-V3 layout, reloads with
    the trained weights, converts with --drafter mtp:FOLDER and drafts losslessly; a module made for another
    target is refused."""
    import specrt
    from specrt.bundle import load_bundle
    from specrt.cli import main
    from specrt.runtime.sampling import SamplingParams
    from tests.test_eagle3_train import write_conversations

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    write_conversations(tmp_path / "data.jsonl")
    out = tmp_path / "mtp"
    code = main(["train-drafter", str(src), "--kind", "mtp", "--data", str(tmp_path / "data.jsonl"), "--out", str(out),
                 "--max-tokens", "1500", "--epochs", "3", "--seq-len", "64"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "training_report.json").read_text())
    assert np.mean(report["losses"][-3:]) < np.mean(report["losses"][:3])
    target = config_from_hf(read_config(src))
    cfg, tensors = load_mtp_from_target(target, {**load_hf_weights(src), **load_hf_weights(out)})
    assert cfg.layout.name == "deepseek" and cfg.own_head
    bundle = tmp_path / "bundle"
    assert main(["convert", str(src), "-o", str(bundle), "--max-context", "64", "--drafter", f"mtp:{out}"]) == 0
    assert load_bundle(bundle).drafter("mtp").source == str(out)
    engine = specrt.load(str(bundle), device="cpu", drafter="mtp")
    params = SamplingParams(max_new_tokens=20, stop_token_ids=())
    plain = engine.generate("the cat and the dog", params, drafter=None).wait()
    assert engine.generate("the cat and the dog", params).wait().token_ids == plain.token_ids

    hf = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": 5}))
    code = main(["convert", str(src), "-o", str(tmp_path / "other"), "--drafter", f"mtp:{out}"])
    assert code == 2 and "made for a target with num_hidden_layers 5; this target has 3" in capsys.readouterr().err


def test_a_large_quantized_head_is_checked_a_chunk_of_rows_at_a_time(tmp_path, monkeypatch):
    """The torch side of an int4 module's check dequantizes a large lm_head a chunk of rows at a time (a 248k-token
    head is 4 GB as float32), the graph's shared tables are quantized from the source a chunk at a time, and the
    module still agrees with the graph exactly (validated on the float-activation twin)."""
    from specrt.bundle import load_bundle
    from specrt.cli import main
    from specrt.convert import head_graph

    used = []
    original = head_graph._chunked_quantized_linear

    def counted(written, name):
        module = original(written, name)
        module.register_forward_hook(lambda m, inputs, out: used.append(out.shape[-1]))
        return module

    monkeypatch.setattr(head_graph, "CHUNK_ROWS", 7)
    monkeypatch.setattr(head_graph, "_chunked_quantized_linear", counted)
    from specrt.convert import target_graph  # and the shared tables are quantized a chunk of rows at a time

    monkeypatch.setattr(target_graph, "ROW_CHUNK", 8)
    monkeypatch.setattr(target_graph, "QUANTIZE_READ_BYTES", 4 * 64 * 16)
    src = make_target(tmp_path / "src", "mimo", seed=3)
    out = tmp_path / "int4"
    assert main(["convert", str(src), "-o", str(out), "--precision", "int4", "--max-context", "96", "--drafter", "mtp"]) == 0
    assert used and set(used) == {load_bundle(out).vocab_size}
    assert load_bundle(out).drafter("mtp").raw["validation"]["max_abs_diff"] <= head_graph.MAX_DIFF


def test_int4_target_gets_an_int4_module_that_drafts_losslessly(tmp_path):
    """Beside an int4 target the module is int4 too (validated against torch running the same int4 weights);
    in batch-invariant mode (one-token calls run their attention on two rows) greedy output equals plain decoding."""
    import specrt
    from specrt.bundle import load_bundle
    from specrt.cli import main
    from specrt.runtime.sampling import SamplingParams

    src = make_target(tmp_path / "src", "mimo", seed=3)
    out = tmp_path / "int4"
    assert main(["convert", str(src), "-o", str(out), "--precision", "int4", "--max-context", "96", "--drafter", "mtp"]) == 0
    entry = load_bundle(out).drafter("mtp")
    assert entry.raw["graph"]["precision"] == "int4" and entry.raw["validation"]["max_abs_diff"] < 1.0
    engine = specrt.load(str(out), device="cpu", drafter="mtp", batch_invariant=True)
    assert engine.target.min_rows == 1 and engine.target.attention_min_rows == 2
    from specrt.errors import SpecrtError

    with pytest.raises(SpecrtError, match="tree drafts on an int4 graph are not exact"):
        specrt.load(str(out), device="cpu", drafter="mtp:tree")
    params = SamplingParams(max_new_tokens=24, stop_token_ids=())
    for prompt in ("the cat and the dog", "a man in the house"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids
