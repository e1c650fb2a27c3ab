"""One checklist over the architecture registry (specrt/archs/), run for every architecture on tiny random
checkpoints from transformers' own classes (tests/tiny_models.py):

- specrt's reading of the HF folder runs in its torch reference exactly as transformers runs the model;
- the file llama.cpp's converter would write (tests/gguf_writer.py) reads back to the same model;
- a folder whose tensor has the wrong shape, or whose config lacks a field, is refused in one line naming it;
- (full tier) the converted graph validates against the torch reference at fp32, int8 and int4, and greedy
  speculation equals plain decoding with each drafter every architecture takes (n-gram, a draft model).

Per-family test files keep what is peculiar to one family (Gemma 4's assistant, Qwen3.5's MTP and states, ...).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import specrt
from specrt import archs
from specrt.cli import main
from specrt.convert import sources
from specrt.errors import SourceError
from specrt.models.config import config_from_hf
from specrt.models.gguf_loader import load_gguf
from specrt.models.layerwise import run_layerwise
from specrt.runtime.sampling import SamplingParams
from tests.gguf_writer import write_tiny_gguf
from tests.tiny_models import hf_model, save_tiny_bundle_source

# registry name -> its tiny checkpoints (the first one is the one converted and decoded)
CASES = {
    "llama": ("llama",),
    "qwen2": ("qwen2",),
    "qwen3": ("qwen3", "qwen3_moe"),
    "gpt_oss": ("gpt_oss",),
    "gemma3": ("gemma3",),
    "gemma4": ("gemma4_text", "gemma4_moe"),
    "qwen3_5": ("qwen3_5_text",),
    "phi3": ("phi3", "phi3_long"),
    "smollm3": ("smollm3",),
    "lfm2": ("lfm2",),
}
TINY = [t for ts in CASES.values() for t in ts]
CONTEXT = 96  # the bundles' --max-context (phi3_long's LongRoPE switches to its long factors beyond 16)
IDS = [5, 9, 30, 41, 7, 60, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]  # longer than phi3_long's 16
# llama.cpp fixes Gemma 3's sliding pattern at 5 of every 6 layers and its head size by the architecture, which the
# 4-layer tiny model does not have: its GGUF reading is held to llama.cpp in tests/test_gguf_llamacpp.py
NO_GGUF_WRITER = {"gemma3"}


def test_every_registered_architecture_has_a_tiny_checkpoint():
    assert set(CASES) == set(archs.ARCHS)
    for name, tinies in CASES.items():  # each tiny checkpoint reads as its architecture
        for tiny in tinies:
            assert archs.for_model_type(hf_model(tiny).config.model_type) is archs.ARCHS[name]


def _transformers_logits(model, ids=IDS) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _reference_logits(hf: dict, weights, ids=IDS) -> np.ndarray:
    cfg = config_from_hf(hf).for_context(CONTEXT)
    return run_layerwise(cfg, weights, [ids]).logits[0]


@pytest.mark.parametrize("tiny", TINY)
def test_the_torch_reference_of_the_folder_equals_transformers(tiny, tmp_path):
    model = hf_model(tiny)
    model.save_pretrained(tmp_path)
    loaded = sources.load(sources.resolve(str(tmp_path)))
    got = _reference_logits(loaded.hf_config, loaded.weights)
    np.testing.assert_allclose(got, _transformers_logits(model), atol=2e-4, rtol=0)


@pytest.mark.parametrize("tiny", [t for t in TINY if t not in NO_GGUF_WRITER])
def test_the_gguf_llama_cpp_writes_reads_back_as_the_model(tiny, tmp_path):
    path = tmp_path / "m.gguf"
    model = write_tiny_gguf(tiny, path)
    hf, weights, _ = load_gguf(path)
    got = _reference_logits(hf, weights)
    np.testing.assert_allclose(got, _transformers_logits(model), atol=2e-4, rtol=0)


@pytest.mark.parametrize("tiny", [ts[0] for ts in CASES.values()])
def test_a_misshaped_tensor_or_a_missing_field_is_named_in_one_line(tiny, tmp_path):
    hf_model(tiny).save_pretrained(tmp_path)
    shard = tmp_path / "model.safetensors"
    tensors = load_file(str(shard))
    name = next(f"model.layers.0.{n}.weight" for n in ("mlp.down_proj", "self_attn.o_proj", "linear_attn.out_proj",
                                                       "conv.out_proj")
                if f"model.layers.0.{n}.weight" in tensors)
    tensors[name] = np.zeros((3, 5), dtype=tensors[name].dtype)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(SourceError) as bad_tensor:
        sources.load(sources.resolve(str(tmp_path)))
    assert "\n" not in str(bad_tensor.value) and ("model.layers.0." in str(bad_tensor.value))

    config = json.loads((tmp_path / "config.json").read_text())
    text = config.get("text_config", config)
    del text["num_attention_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match="num_attention_heads") as missing:
        sources.load(sources.resolve(str(tmp_path)))
    assert "\n" not in str(missing.value)


# ---- full tier: conversions and decoding ------------------------------------------------------------------------

PARAMS = SamplingParams(max_new_tokens=24, stop_token_ids=())
PROMPTS = ("the cat and the dog", "a man in the house of the world", "the world the world the world")


@pytest.fixture(scope="module")
def draft_source(tmp_path_factory):
    return save_tiny_bundle_source("qwen3", tmp_path_factory.mktemp("draft") / "qwen3", seed=1)


@pytest.mark.full
@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_graph_validates_and_speculation_equals_plain(name, precision, draft_source, tmp_path, capsys):
    """Conversion validates the graph against the torch reference (it refuses a bundle that disagrees); at fp32
    greedy decoding with n-gram drafting, and with a draft model, equals plain decoding token for token."""
    tiny = CASES[name][0]
    src = save_tiny_bundle_source(tiny, tmp_path / "src")
    out = tmp_path / "bundle"
    drafter = ["--drafter", f"draft-model:{draft_source}"] if precision == "fp32" else []
    assert main(["convert", str(src), "-o", str(out), "--precision", precision, "--max-context", str(CONTEXT),
                 *drafter]) == 0, capsys.readouterr().err
    assert "top-1 agreement" in capsys.readouterr().err
    if precision != "fp32":
        return
    for drafter in ("ngram", "draft-model"):
        engine = specrt.load(str(out), device="cpu", drafter=drafter, batch_invariant=True)
        engine.adaptive = False  # draft on every step (the adaptive loop may switch a drafter off)
        drafted = rejected = 0
        for prompt in PROMPTS:
            plain = engine.generate(prompt, PARAMS, drafter=None).wait()
            spec = engine.generate(prompt, PARAMS).wait()
            assert spec.stats.drafter == drafter
            counts, shares = spec.stats.drafted_by_position, spec.stats.acceptance_by_position
            drafted += sum(counts)
            rejected += sum(round(n * (1 - a)) for n, a in zip(counts, shares))
            assert spec.token_ids == plain.token_ids, (name, drafter, prompt)
        assert drafted, (name, drafter)  # it drafted
        if drafter == "draft-model":  # another model's drafts: some rejected, so the caches (and states) roll back
            assert rejected, name


@pytest.mark.full
@pytest.mark.parametrize("name", [n for n in CASES if n not in NO_GGUF_WRITER])
def test_the_gguf_converts_and_decodes_as_transformers(name, tmp_path):
    """The GGUF llama.cpp's converter writes converts on its own (its tokenizer from the file's metadata); plain
    greedy decoding from prompt ids equals transformers', and n-gram speculation equals plain decoding."""
    from tests.tiny_models import GGUF_PROMPT_IDS, assert_ids_decode_as_transformers

    model = write_tiny_gguf(CASES[name][0], tmp_path / "m.gguf")
    out = tmp_path / "bundle"
    assert main(["convert", str(tmp_path / "m.gguf"), "-o", str(out), "--max-context", str(CONTEXT)]) == 0
    engine = specrt.load(str(out), device="cpu", drafter="ngram", batch_invariant=True)
    plain = assert_ids_decode_as_transformers(engine, model)
    engine.reset()
    spec = engine.generate("", PARAMS, ids=list(GGUF_PROMPT_IDS)).wait().token_ids
    assert spec == plain[:len(spec)] and len(spec) == PARAMS.max_new_tokens
