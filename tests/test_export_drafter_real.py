"""`specrt export-drafter`: the shipped EAGLE-3 head and DFlash drafter of the default model written for vLLM, SGLang
and the speculators format; each layout checked against what that engine's loader reads (names, shapes, layer-id
conventions; docs/handoff.md cites the engines' code) and read back by specrt's own loaders as the same drafter.
(vLLM itself running the exports: tests/test_vllm_handoff_real.py, full tier.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from specrt.cli import main
from specrt.convert.export_drafter import export
from specrt.errors import SourceError, SpecrtError
from specrt.models.dflash import load_dflash_checkpoint
from specrt.models.eagle3 import load_eagle3_checkpoint
from tests.conftest import DEFAULT_MODEL, DFLASH_HEAD, EAGLE3_HEAD

pytestmark = pytest.mark.real_model
SHIPPED = {"eagle3": EAGLE3_HEAD, "dflash": DFLASH_HEAD}


@pytest.fixture(scope="module")
def target():
    from specrt.convert import sources

    return sources.load(sources.resolve(DEFAULT_MODEL, log=lambda m: None))


@pytest.fixture(scope="module")
def exports(tmp_path_factory, target) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for engine in ("vllm", "sglang", "speculators"):
        for kind, folder in SHIPPED.items():
            [done] = export(folder, engine, root / engine / kind, target=DEFAULT_MODEL, log=lambda m: None)
            out[(engine, kind)] = done.folder
    return out


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _head_rows(target, ids):
    return np.asarray(target.weights["model.embed_tokens.weight"], dtype=np.float32)[ids]  # tied lm_head


@pytest.mark.parametrize("engine", ["vllm", "sglang", "speculators"])
def test_eagle3_export_reads_back_as_the_same_head(exports, target, engine):
    want_cfg, want = load_eagle3_checkpoint(EAGLE3_HEAD, target.config)
    got_cfg, got = load_eagle3_checkpoint(exports[(engine, "eagle3")], target.config)
    assert got_cfg == want_cfg and want_cfg.aux_layers == (2, 15, 27)
    assert set(got) == set(want) - {"t2d"}
    for name in got:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("engine", ["vllm", "sglang", "speculators"])
def test_dflash_export_reads_back_as_the_same_drafter(exports, target, engine):
    want_cfg, want = load_dflash_checkpoint(DFLASH_HEAD, target.config)
    folder = exports[(engine, "dflash")]
    got_cfg, got = load_dflash_checkpoint(folder, target.config)
    assert got_cfg == want_cfg and want_cfg.target_layer_ids == (2, 15, 27)
    raw = load_file(str(folder / "model.safetensors"))
    if engine == "sglang":  # SGLang drafts over the whole vocabulary: the draft vocabulary is dropped
        assert "d2t" not in got and "d2t" not in raw and "lm_head.weight" not in raw
    else:  # d2t, and the target's lm_head rows of the draft vocabulary as the drafter's own
        np.testing.assert_array_equal(got["d2t"], want["d2t"])
        ids = np.arange(len(want["d2t"])) + want["d2t"]
        np.testing.assert_array_equal(raw["lm_head.weight"], _head_rows(target, ids))
    for name in want:
        if name != "d2t":
            np.testing.assert_array_equal(got[name], want[name])


def test_eagle3_for_vllm_and_sglang_one_layout_both_conventions(exports):
    """vLLM (gpu_model_runner._get_eagle3_aux_layers_from_config) reads the top-level list first, as HF
    hidden_states[k]; SGLang (spec_aux_hidden_state.py, set_eagle3_layers_to_capture) reads eagle_config's list and
    adds 1. Both must land on the outputs of layers 2, 15, 27 = hidden_states 3, 16, 28."""
    for engine in ("vllm", "sglang"):
        folder = exports[(engine, "eagle3")]
        cfg = _config(folder)
        vllm_reads = cfg["eagle_aux_hidden_state_layer_ids"]
        sglang_reads = [k + 1 for k in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        assert vllm_reads == sglang_reads == [3, 16, 28]
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]  # the one class name both registries map
        assert cfg["draft_vocab_size"] == 8192  # SGLang reads it as a plain attribute: it must be present
        assert cfg["norm_before_residual"] is False  # SGLang's layer has no such option
        tensors = load_file(str(folder / "model.safetensors"))
        assert not any(n.startswith(("model.", "midlayer.")) for n in tensors)  # vLLM adds "model." itself
        assert "t2d" not in tensors
        assert tensors["lm_head.weight"].shape == (8192, 576) and tensors["d2t"].dtype == np.int64
        assert tensors["fc.weight"].shape == (576, 3 * 576)
        assert tensors["layers.0.self_attn.q_proj.weight"].shape == (576, 2 * 576)  # [emb; hidden] in
        targets = np.arange(8192) + tensors["d2t"]  # offsets: target id = draft id + d2t[draft id]
        assert targets.min() >= 0 and targets.max() < 49152 and len(np.unique(targets)) == 8192


def test_dflash_for_sglang_satisfies_its_loader(exports):
    """What SGLang's DFlash path reads (dflash_utils.parse_dflash_draft_config, models/dflash.py): architecture
    DFlashDraftModel; dflash_config.target_layer_ids (outputs: it captures before layer k + 1), block_size (its
    draft tokens), mask_token_id < the target vocabulary; fc [hidden, n * hidden]; layers.{i}.* with q/k norms;
    no EAGLE ids (which vLLM would read first)."""
    folder = exports[("sglang", "dflash")]
    cfg = _config(folder)
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dflash_config"] == {"target_layer_ids": [2, 15, 27], "block_size": 8, "mask_token_id": 3}
    assert "eagle_config" not in cfg and "eagle_aux_hidden_state_layer_ids" not in cfg
    tensors = load_file(str(folder / "model.safetensors"))
    assert tensors["fc.weight"].shape == (cfg["hidden_size"], 3 * cfg["hidden_size"])
    for i in range(cfg["num_hidden_layers"]):
        for part in ("q_norm", "k_norm", "q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"layers.{i}.self_attn.{part}.weight" in tensors


def test_dflash_for_vllm_has_what_its_draft_vocabulary_needs(exports):
    """vLLM's DFlashQwen3ForCausalLM creates draft_id_to_target_id only when draft_vocab_size differs from the
    target's vocabulary, and shares the target's full lm_head unless the checkpoint brings its own."""
    cfg = _config(exports[("vllm", "dflash")])
    assert cfg["draft_vocab_size"] == 8192 and cfg["dflash_config"]["target_layer_ids"] == [2, 15, 27]
    assert "eagle_config" not in cfg and "eagle_aux_hidden_state_layer_ids" not in cfg
    tensors = load_file(str(exports[("vllm", "dflash")] / "model.safetensors"))
    assert tensors["lm_head.weight"].shape == (8192, 576) and tensors["d2t"].shape == (8192,)


def test_speculators_configs_use_hidden_state_indices(exports):
    eagle = _config(exports[("speculators", "eagle3")])
    assert eagle["speculators_model_type"] == "eagle3" and "model_type" not in eagle
    assert eagle["eagle_aux_hidden_state_layer_ids"] == [3, 16, 28]
    assert eagle["norm_before_residual"] is False  # vLLM reads an absent key as true in this format
    assert eagle["transformer_layer_config"]["model_type"] == "llama"
    assert eagle["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    dflash = _config(exports[("speculators", "dflash")])
    assert dflash["speculators_model_type"] == "dflash"
    assert dflash["aux_hidden_state_layer_ids"] == [3, 16, 28]  # vLLM: dflash target_layer_ids = these - 1
    assert dflash["transformer_layer_config"]["model_type"] == "qwen3"
    assert dflash["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7


def test_an_eagle_config_list_alone_is_refused_in_one_line(tmp_path, capsys):
    """The layout specrt wrote before: ids in eagle_config only, which vLLM and SGLang read one layer apart."""
    old = tmp_path / "old"
    shutil.copytree(EAGLE3_HEAD, old)
    cfg = _config(old)
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (old / "config.json").write_text(json.dumps(cfg))
    assert main(["export-drafter", str(old), "--target", DEFAULT_MODEL, "--for", "vllm", "-o",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "alone is ambiguous" in err and "[3, 16, 28]" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))
    with pytest.raises(SourceError, match="ambiguous"):
        from specrt.convert import sources

        load_eagle3_checkpoint(old, sources.load(sources.resolve(DEFAULT_MODEL, log=lambda m: None)).config)


def test_bundle_export_writes_each_drafter_and_explains_the_rest(fp32_bundle, tmp_path, capsys):
    assert main(["export-drafter", str(fp32_bundle), "--for", "vllm", "-o", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["dflash", "eagle3"]
    assert "draft-model" in captured.err and "not exported" in captured.err
    assert "num_speculative_tokens\": 7" in captured.out
    assert main(["export-drafter", str(fp32_bundle), "--for", "vllm", "-o", str(tmp_path / "out")]) == 2
    assert "exists" in capsys.readouterr().err


def test_checkpoint_folder_needs_its_target(tmp_path):
    with pytest.raises(SpecrtError, match="--target"):
        export(EAGLE3_HEAD, "vllm", tmp_path / "out")


def test_eagle3_export_for_openvino_is_eagles_own_layout(target, tmp_path):
    """What optimum-intel's LlamaEagle3Model loads: midlayer.* names, the target's embedding table, d2t offsets and
    t2d; specrt reads it back as the same head. DFlash has no OpenVINO layout: refused in one line."""
    [done] = export(EAGLE3_HEAD, "openvino", tmp_path / "ov", target=DEFAULT_MODEL, log=lambda m: None)
    raw = load_file(str(done.folder / "model.safetensors"))
    cfg = _config(done.folder)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 8192
    assert all(not k.startswith(("layers.", "model.")) for k in raw) and "midlayer.self_attn.q_proj.weight" in raw
    np.testing.assert_array_equal(raw["embed_tokens.weight"],
                                  np.asarray(target.weights["model.embed_tokens.weight"], dtype=np.float32))
    assert raw["d2t"].dtype == np.int64 and raw["t2d"].dtype == np.bool_ and raw["t2d"].sum() == len(raw["d2t"])
    assert raw["t2d"][np.arange(len(raw["d2t"])) + raw["d2t"]].all()
    want_cfg, want = load_eagle3_checkpoint(EAGLE3_HEAD, target.config)
    got_cfg, got = load_eagle3_checkpoint(done.folder, target.config)
    assert got_cfg == want_cfg
    for name in set(want) - {"t2d"}:
        np.testing.assert_array_equal(got[name], want[name])
    # the shipped head reads OpenVINO's default layers for a 30-layer target: no note needed
    assert not any("hidden_layers_list" in n for n in done.notes)
    with pytest.raises(SpecrtError, match="not exported for OpenVINO"):
        export(DFLASH_HEAD, "openvino", tmp_path / "ovd", target=DEFAULT_MODEL, log=lambda m: None)
    assert not (tmp_path / "ovd").exists()
