"""Gemma 4 targets on tiny random checkpoints built from transformers' own classes: sliding layers and full layers
of another head size (keys as values, proportional rope), E2B's per-layer input embeddings and KV shared by the
last layers, soft-capped logits, in the text-only and the published multimodal layout; and the MoE variant (a dense
MLP beside gated-GELU experts in every layer). Plain decoding equals transformers; int8 / int4 are validated against
torch on the same weights; n-gram, draft-model and EAGLE-3 speculation equals plain decoding (int4 / int8 in
batch-invariant mode, the experts' calls token by token)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from specrt.cli import main
from specrt.models.config import config_from_hf
from specrt.runtime.sampling import SamplingParams
from tests.tiny_models import (
    GEMMA4_TEXT, assert_greedy_equals_transformers, assert_refused_in_one_line, edit_config, hf_config, hf_model,
    save_tiny_bundle_source,
)

PROMPTS = ("the cat and the dog", "a man in the house of the world", "what is the time of day for you")
GREEDY = SamplingParams(max_new_tokens=64, stop_token_ids=())


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from specrt.models.eagle3 import save_eagle3_checkpoint, state_dict_of
    from tests.test_eagle3 import random_head

    root = tmp_path_factory.mktemp("gemma4")
    out = {arch: save_tiny_bundle_source(arch, root / arch) for arch in ("gemma4_text", "gemma4", "gemma4_moe")}
    out["sibling"] = save_tiny_bundle_source("gemma4_text", root / "sibling", seed=5)  # same tokenizer
    head = random_head(3)  # reads target layers 2, 1, 0
    save_eagle3_checkpoint(root / "head", head.cfg, state_dict_of(head))
    out["eagle3"] = root / "head"
    return out


@pytest.fixture(scope="module")
def bundles(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4_bundles")
    out = {"gemma4": root / "multimodal", "gemma4_text": root / "text", "gemma4_moe": root / "moe"}
    for arch in ("gemma4", "gemma4_moe"):
        assert main(["convert", str(sources[arch]), "-o", str(out[arch]), "--max-context", "128"]) == 0
    assert main(["convert", str(sources["gemma4_text"]), "-o", str(out["gemma4_text"]), "--max-context", "128",
                 "--drafter", f"draft-model:{sources['sibling']}", "--drafter", f"eagle3:{sources['eagle3']}"]) == 0
    return out


def test_config_reads_both_forms_of_the_full_layers_sizes():
    """transformers 5.25 saves the full layers' head size and KV heads as per_layer_config; older configs (and the
    published ones) say global_head_dim / num_global_key_value_heads: both read alike."""
    saved = hf_config("gemma4_text").to_dict()
    assert "per_layer_config" in saved and "global_head_dim" not in saved
    published = {**{k: v for k, v in saved.items() if k != "per_layer_config"}, **{
        k: GEMMA4_TEXT[k] for k in ("global_head_dim", "num_global_key_value_heads")}}
    a, b = config_from_hf(saved), config_from_hf(published)
    assert a == b
    assert [a.kv_shape_of(i) for i in range(6)] == [(2, 16), (1, 32)] * 3
    assert [a.kv_source(i) for i in range(6)] == [0, 1, 2, 3, 2, 3] and a.attention_layers == (0, 1, 2, 3)
    assert [a.intermediate_of(i) for i in range(6)] == [96] * 4 + [192] * 2  # double-wide where the KV is shared
    assert a.rope.inv_freq(32)[:4] == pytest.approx([1e6 ** (-j / 16) for j in range(4)])
    assert a.rope.inv_freq(32)[4:] == [0.0] * 12  # proportional: a quarter of the pairs turn


@pytest.mark.parametrize("arch", ["gemma4_text", "gemma4", "gemma4_moe"])
def test_plain_greedy_equals_transformers(bundles, arch):
    import specrt
    from specrt.bundle import load_bundle

    manifest = load_bundle(bundles[arch])
    if arch == "gemma4_moe":
        assert manifest.kv.cached_layers() == (0, 1, 2, 3)
        assert manifest.kv.shapes() == ((2, 16), (1, 32)) * 2
    else:
        assert manifest.kv.layer_ids == (0, 1, 2, 3)  # the last two layers keep no cache of their own
        assert manifest.kv.shapes() == ((2, 16), (1, 32)) * 2
    engine = specrt.load(str(bundles[arch]), device="cpu")
    assert_greedy_equals_transformers(engine, hf_model(arch), PROMPTS, GREEDY)


def test_speculation_is_lossless(bundles):
    import specrt
    from specrt.app.api import make_drafter

    bundle = bundles["gemma4_text"]
    engine = specrt.load(str(bundle), device="cpu")
    engine.adaptive, engine.draft_length = False, 3
    names = ("ngram", "draft-model", "eagle3")
    drafters = {n: make_drafter(n, bundle, engine.manifest, ["CPUExecutionProvider"]) for n in names}
    drafted = {}
    for prompt in PROMPTS:
        plain = engine.generate(prompt, GREEDY, drafter=None).wait().token_ids
        for name, drafter in drafters.items():
            spec = engine.generate(prompt, GREEDY, drafter=drafter).wait()
            assert spec.token_ids == plain, (name, prompt)
            drafted[name] = drafted.get(name, 0) + sum(spec.stats.drafted_by_position)
    assert all(drafted.values()), drafted


@pytest.mark.parametrize("arch, precision", [("gemma4_text", "int8"), ("gemma4_text", "int4"),
                                             ("gemma4_moe", "int4")])
def test_quantized_gemma4_is_validated_and_speculates_losslessly(sources, tmp_path, arch, precision):
    """int8 / int4 graphs (the per-layer embedding table quantized as the token embeddings are; each expert's
    projections) validated against torch on the same quantized weights; in batch-invariant mode greedy n-gram
    speculation equals plain decoding."""
    import specrt
    from specrt.bundle import load_bundle

    out = tmp_path / precision
    assert main(["convert", str(sources[arch]), "-o", str(out), "--precision", precision,
                 "--max-context", "128"]) == 0
    manifest = load_bundle(out)
    assert manifest.provenance["validation"]["quantized_reference"]["max_abs_diff"] < 1e-3
    engine = specrt.load(str(out), device="cpu", drafter="ngram", batch_invariant=True)
    engine.adaptive, engine.draft_length = False, 3
    for prompt in PROMPTS[:2]:
        plain = engine.generate(prompt, GREEDY, drafter=None).wait()
        assert engine.generate(prompt, GREEDY).wait().token_ids == plain.token_ids



@pytest.mark.parametrize("edit, message", [
    (lambda s: edit_config(s, num_kv_shared_layers=6), "config: num_kv_shared_layers = 6 must be below "
     "num_hidden_layers (6)"),
    (lambda s: edit_config(s, num_kv_shared_layers=5), "config: a layer kind that shares KV has no earlier layer of "
     "its kind that keeps its own"),
    (lambda s: edit_config(s, hidden_size_per_layer_input=32), "tensor model.layers.0.per_layer_input_gate.weight "
     "has shape (16, 64), expected (32, 64)"),
    (lambda s: edit_config(s, attention_k_eq_v=False),
     "missing tensor model.layers.1.self_attn.v_proj.weight"),
])
def test_inconsistent_sources_are_refused_in_one_line(sources, tmp_path, capsys, edit, message):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(sources["gemma4_text"], src)
    edit(src)
    assert_refused_in_one_line(["convert", str(src), "-o", str(tmp_path / "out")], tmp_path / "out", capsys,
                               re.escape(message))


def test_torch_reference_equals_transformers_with_a_cache():
    """The torch reference (models/gemma4.py via CausalLM; the MoE variant's fused experts read an expert at a time)
    over a prompt in two calls equals transformers' logits."""
    from specrt.convert.pipeline import _torch_model
    from specrt.models.gemma4 import expert_view

    for arch in ("gemma4_text", "gemma4_moe"):
        model = hf_model(arch)
        cfg = config_from_hf(model.config.to_dict())
        weights = expert_view({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
        _assert_same_logits(model, _torch_model(cfg, weights))


def _assert_same_logits(model, ours) -> None:
    import torch

    ids = torch.tensor([np.random.default_rng(0).integers(0, 97, 20)])
    with torch.no_grad():
        ref = model(ids).logits
        first, past, _ = ours(ids[:, :12])
        second, _, _ = ours(ids[:, 12:], past=past)
    assert torch.allclose(torch.cat((first, second), 1), ref, atol=1e-5)


def write_gguf(arch: str, path) -> None:
    """The tiny model as llama.cpp's converter writes it (archs/gemma4_gguf.py; checked against llama.cpp itself
    by test_llama_cpp_decodes_the_written_gguf_as_transformers)."""
    from specrt.models.gemma4 import expert_view
    from tests.gguf_writer import write_gemma4_gguf
    from tests.tiny_models import WORDS

    model = hf_model(arch)
    weights = expert_view({k: v.detach().numpy() for k, v in model.state_dict().items()})
    write_gemma4_gguf(path, model.config.to_dict(), weights, ["<|endoftext|>"] + list(WORDS[1:97]), eos=4)
    return model, weights


@pytest.mark.parametrize("arch", ["gemma4_text", "gemma4_moe"])
def test_gguf_in_llama_cpps_gemma4_layout_converts(tmp_path, arch):
    """Names, rope_freqs (the partial rotary factor), per-block KV heads and MLP widths, keys as values and the
    stacked experts read back exactly; the bundle decodes as transformers does."""
    import specrt
    from specrt.models.gguf_loader import load_gguf
    from tests.tiny_models import assert_ids_decode_as_transformers

    model, weights = write_gguf(arch, tmp_path / "m.gguf")
    hf, loaded, _ = load_gguf(tmp_path / "m.gguf")
    ours, theirs = config_from_hf(hf).to_dict(), config_from_hf(model.config.to_dict()).to_dict()
    apart = {"rms_norm_eps", "bos_token_id", "eos_token_ids"}  # float32 in the file; the special ids its tokens give
    assert {k: v for k, v in ours.items() if k not in apart} == {k: v for k, v in theirs.items() if k not in apart}
    for name, w in weights.items():
        if name != "lm_head.weight":
            np.testing.assert_array_equal(loaded[name], np.asarray(w, np.float32).reshape(loaded.shape(name)))
    assert main(["convert", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "bundle"), "--max-context", "128"]) == 0
    assert_ids_decode_as_transformers(specrt.load(str(tmp_path / "bundle"), device="cpu"), model)


@pytest.mark.full
@pytest.mark.parametrize("arch", ["gemma4_text", "gemma4_moe"])
def test_llama_cpp_decodes_the_written_gguf_as_transformers(tmp_path, arch):
    """The writer's layout is llama.cpp's own: the bundled llama.cpp (llama-cpp-python) decodes the written file
    greedily as transformers does, 32 tokens."""
    from pathlib import Path

    import specrt
    import torch

    from specrt.app.compare.systems import llama_cpp_python
    from specrt.app.compare.worker_client import WorkerProcess
    from tests.tiny_models import GGUF_PROMPT_IDS

    model, _ = write_gguf(arch, tmp_path / "m.gguf")
    ids, want = list(GGUF_PROMPT_IDS), []
    with torch.no_grad():
        for _ in range(32):
            want.append(int(model(torch.tensor([ids + want])).logits[0, -1].argmax()))
    script = Path(specrt.__file__).resolve().parent / "app" / "compare" / "workers" / "llama_cpp_worker.py"
    worker = WorkerProcess(llama_cpp_python(log=lambda m: None), script,
                           {"model": str(tmp_path / "m.gguf"), "threads": 2, "n_ctx": 256}, tmp_path / "worker.log")
    try:
        assert worker.generate(ids, 32, stop_ids=()).token_ids == want
    finally:
        worker.close()
