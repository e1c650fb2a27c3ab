"""Streaming conversion: sources read lazily, the graph's weights written as they are made, the torch reference
run layer by layer. It must write byte for byte what the in-memory path wrote (tests/inmemory_convert.py) and
name bad sources (a truncated shard, a tensor an index promises, a GGUF tensor past the file's end)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from specrt.convert import sources
from specrt.convert.pipeline import _torch_model
from specrt.convert.smoothing import smooth_down_proj
from specrt.convert.target_graph import GraphOptions, write_target_graph
from specrt.errors import SourceError
from specrt.models.layerwise import run_layerwise
from tests.inmemory_convert import down_proj_input_max, write_graph_in_memory
from tests.tiny_models import ARCHS, hf_model, save_hf_folder

PROMPTS = [[1, 5, 9, 13, 2, 40, 41], [3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14, 15]]


def _load(arch, tmp_path):
    return sources.load(sources.resolve(str(save_hf_folder(arch, tmp_path / arch))))


@pytest.mark.parametrize("arch", ARCHS)
def test_layerwise_reference_computes_the_whole_model(arch, tmp_path):
    """One layer at a time gives the whole model's logits and taps bit for bit, HF's logits, and the calibration
    statistics the whole-model hooks gave."""
    loaded = _load(arch, tmp_path)
    cfg = loaded.config
    taps = (0, cfg.num_layers - 1)
    ref = run_layerwise(cfg, loaded.weights, PROMPTS, taps, observe=2)
    whole = _torch_model(cfg, loaded.weights.materialize())
    hf = hf_model(arch).eval()
    for p, ids in enumerate(PROMPTS):
        with torch.no_grad():
            logits, _, tap = whole(torch.tensor([ids]), hidden_layers=taps)
            hf_logits = hf(torch.tensor([ids])).logits[0].numpy()
        assert np.array_equal(ref.logits[p], logits[0].numpy())
        assert np.array_equal(ref.taps[p], tap[0].numpy())
        np.testing.assert_allclose(ref.logits[p], hf_logits, atol=1e-4)
    stats = down_proj_input_max(whole, PROMPTS[:2])
    assert sorted(stats) == sorted(ref.down_proj_max) == list(range(cfg.num_layers))
    for i in stats:
        assert np.array_equal(stats[i], ref.down_proj_max[i])


# every architecture and precision in the full tier; each architecture once (and each precision) by default
DEFAULT_PAIRS = {("llama", "int4"), ("qwen2", "fp16"), ("qwen3", "fp32"), ("gemma3", "int4")}


@pytest.mark.parametrize("arch, precision", [
    pytest.param(a, p, marks=() if (a, p) in DEFAULT_PAIRS else pytest.mark.full)
    for a in ARCHS for p in ("fp32", "fp16", "int4")])
def test_streamed_graph_files_equal_the_in_memory_path(arch, precision, tmp_path):
    loaded = _load(arch, tmp_path)
    cfg = loaded.config
    opts = GraphOptions(precision=precision, max_context=64, hidden_layers=(1,))
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    write_graph_in_memory(cfg, loaded.weights.materialize(), opts, PROMPTS, old)
    weights = loaded.weights
    if precision == "int4":
        weights = smooth_down_proj(weights, run_layerwise(cfg, weights, PROMPTS, observe=len(PROMPTS)).down_proj_max)
    write_target_graph(cfg, weights, opts, new, "target")
    for name in ("target.onnx", "target.onnx.data"):
        assert (old / name).read_bytes() == (new / name).read_bytes(), name


def test_convert_writes_the_in_memory_paths_files(tmp_path):
    """The whole `specrt convert` (int4, with taps for a drafter) against the in-memory path on the same model."""
    from specrt.convert.pipeline import ConvertOptions, _tokenize, convert
    from specrt.convert.smoothing import CALIBRATION_TEXTS
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("qwen3", tmp_path / "src")
    manifest = convert(str(src), tmp_path / "bundle", ConvertOptions(precision="int4", max_context=64,
                                                                        hidden_layers=(0, 2)))
    assert manifest.target.hidden_layers == (0, 2)
    loaded = sources.load(sources.resolve(str(src)))
    calibration = _tokenize(tmp_path / "bundle", CALIBRATION_TEXTS, loaded.config.vocab_size, 64)
    old = tmp_path / "old"
    old.mkdir()
    opts = GraphOptions(precision="int4", max_context=64, hidden_layers=(0, 2), attention_rows_input=True,
                        exact_attention=True)  # as convert builds a CPU graph
    write_graph_in_memory(loaded.config, loaded.weights.materialize(), opts, calibration, old)
    for name in ("target.onnx", "target.onnx.data"):
        assert (old / name).read_bytes() == (tmp_path / "bundle" / name).read_bytes(), name


def _shard(tmp_path):
    """A two-shard HF folder with an index, like the published large checkpoints."""
    from safetensors.numpy import load_file, save_file

    src = save_hf_folder("llama", tmp_path / "one")
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(src / "config.json", folder / "config.json")
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(folder / shard))
    weight_map = {n: shard for shard, part in shards.items() for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder, tensors, shards


def test_sharded_source_reads_each_tensor_from_its_shard(tmp_path):
    folder, tensors, _ = _shard(tmp_path)
    weights = sources.load(sources.resolve(str(folder))).weights
    assert sorted(weights) == sorted(tensors)
    for name, value in tensors.items():
        assert np.array_equal(weights[name], value)
        assert weights[name] is not weights[name]  # read on each access, kept by nobody


def test_bad_sharded_sources_are_named(tmp_path):
    folder, tensors, shards = _shard(tmp_path)
    second = folder / "model-00002-of-00002.safetensors"
    last = shards[second.name][-1]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    # the index promises a tensor its shard lacks
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = second.name
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"model-00002-of-00002.safetensors: lacks tensor model.layers.9.mlp"):
        sources.load(sources.resolve(str(folder)))
    del index["weight_map"]["model.layers.9.mlp.up_proj.weight"]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    # a truncated shard: its last tensor runs past the end
    data = second.read_bytes()
    second.write_bytes(data[:-8])
    with pytest.raises(SourceError, match=rf"model-00002-of-00002.safetensors: tensor '{last}' runs past the end"):
        sources.load(sources.resolve(str(folder)))
    # a missing shard
    second.unlink()
    with pytest.raises(SourceError, match="missing weight shard .*model-00002-of-00002.safetensors"):
        sources.load(sources.resolve(str(folder)))


def test_gguf_tensor_past_the_end_is_named(tmp_path):
    from specrt.models.gguf_loader import load_gguf
    from tests.gguf_writer import write_gguf

    model = hf_model("qwen2")
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    path = tmp_path / "m.gguf"
    write_gguf(path, "qwen2", model.config, weights, lambda name, w: (w, None))
    _, lazy, reader = load_gguf(path)
    last = max(reader.tensors, key=lambda t: t.data_offset)
    data = path.read_bytes()
    path.write_bytes(data[:-16])
    with pytest.raises(SourceError, match=rf"m.gguf: tensor {last.name} \(F32\) runs past the end of the file"):
        load_gguf(path)


MEMORY_BUDGET_MB = 240  # measured: the streaming conversion grows by ~157 MB, the in-memory path by ~366 MB


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="RLIMIT_DATA and /proc are Linux's")
def test_streaming_fits_a_memory_limit_the_in_memory_path_exceeds(tmp_path):
    """A 38M-parameter model (150 MB as float32) under a data-memory limit of 240 MB above the imports: the
    whole streaming `specrt convert` (validation included) fits; the in-memory path's graph alone does not."""
    import subprocess
    import sys

    from tests.memory_limited_convert import ROOT, write_mid_model

    src = tmp_path / "mid"
    assert write_mid_model(src) > 37_000_000
    script = str(ROOT / "tests" / "memory_limited_convert.py")
    results = {}
    for mode in ("new", "old"):
        done = subprocess.run([sys.executable, script, mode, str(src), str(tmp_path / mode), str(MEMORY_BUDGET_MB)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=600)
        results[mode] = done
    assert results["new"].returncode == 0 and "converted" in results["new"].stdout, results["new"].stderr[-2000:]
    assert (tmp_path / "new" / "specrt.json").is_file()
    assert results["old"].returncode != 0 and "converted" not in results["old"].stdout
    assert "allocate" in results["old"].stderr or "MemoryError" in results["old"].stderr, results["old"].stderr[-2000:]


@pytest.mark.parametrize("preset, drafter, layers", [("llama-3.1-8b", "eagle3", "3"), ("qwen3-8b", "dflash", "3"),
                                                     ("gemma4-e4b", "assistant", "8"),
                                                     ("gemma4-26b-a4b", "assistant", "6")])
def test_synthetic_real_size_layouts_convert_and_draft_losslessly(preset, drafter, layers, tmp_path):
    """scripts/synthetic_model.py's test-size twins of the 8B layouts and Gemma 4's (sharded bf16 target with its
    index, the published drafter layouts: an fp16 EAGLE-3 head with d2t/t2d, a bf16 DFlash drafter, a Gemma 4
    assistant with ordered embeddings or a plain head) convert to int4 with
    their drafter, and greedy speculative output equals plain output (scripts/real_size_check.py)."""
    import sys

    from specrt.convert.pipeline import ConvertOptions, convert
    from tests.memory_limited_convert import ROOT

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import real_size_check
        import synthetic_model
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    synthetic_model.main([preset, str(tmp_path / "src"), "--tiny", "--layers", layers])
    assert len(json.loads((tmp_path / "src" / "target" / "model.safetensors.index.json").read_text())["weight_map"]) >= 30
    convert(str(tmp_path / "src" / "target"), tmp_path / "bundle",
            ConvertOptions(precision="int4", max_context=256, drafter=f"{drafter}:{tmp_path / 'src' / drafter}"))
    entry = json.loads((tmp_path / "bundle" / "specrt.json").read_text())["drafters"][0]
    # the drafter is int4 beside the int4 target, and computes what torch computes with its very int4 weights
    assert entry["graph"]["precision"] == "int4" and entry["validation"]["max_abs_diff"] < 1e-3
    assert "int8_activations_max_abs_diff" in entry["validation"]
    report = real_size_check.check(tmp_path / "bundle", drafter, tokens=16)
    assert report["equal"] and report["new_tokens"] == 16
    assert report["target_calls"]["speculative"] <= 16


def test_a_source_too_large_for_free_memory_is_refused_up_front(tmp_path, monkeypatch, capsys):
    """The estimate is compared with MemAvailable before any work: one line, nothing at the output path."""
    from specrt.cli import main
    from specrt.convert import memory
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path / "src")
    monkeypatch.setattr(memory, "available_bytes", lambda: 64 << 20)  # a machine with 64 MB free
    code = main(["convert", str(src), "-o", str(tmp_path / "bundle"), "--precision", "int4"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1
    assert "needs about" in err and "GiB of memory; 0.1 GiB is available" in err
    assert not (tmp_path / "bundle").exists() and list(tmp_path.iterdir()) == [tmp_path / "src"]


def test_reference_logits_read_the_head_in_chunks_of_rows(tmp_path, monkeypatch):
    """The reference reads its output head a chunk of rows at a time (a 248k x 4096 head is 4 GB as float32): the
    logits equal those of the whole head, and no read asks for more than a chunk."""
    from specrt.models import layerwise

    loaded = _load("qwen3", tmp_path)
    cfg = loaded.config
    whole = run_layerwise(cfg, loaded.weights, PROMPTS)
    asked = []
    rows = loaded.weights.rows
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"

    def counted(name, ids):
        if name == head:
            asked.append(len(ids))
        return rows(name, ids)

    monkeypatch.setattr(loaded.weights, "rows", counted)
    monkeypatch.setattr(layerwise, "HEAD_ROWS", 7)
    chunked = run_layerwise(cfg, loaded.weights, PROMPTS)
    assert max(asked) == 7 and sum(asked) >= cfg.vocab_size
    for a, b in zip(whole.logits, chunked.logits, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_large_table_quantized_in_chunks_of_rows_writes_the_same_bytes(tmp_path, monkeypatch):
    """A weight larger than QUANTIZE_READ_BYTES as float32 (a 248k-token embedding table or lm_head) is read and
    quantized a chunk of rows at a time: the files are byte for byte those of quantizing it whole."""
    from specrt.convert import target_graph

    loaded = _load("qwen3", tmp_path)
    cfg = loaded.config
    opts = GraphOptions(precision="int4", max_context=64, hidden_layers=(1,))
    whole, chunked = tmp_path / "whole", tmp_path / "chunked"
    whole.mkdir()
    chunked.mkdir()
    write_target_graph(cfg, loaded.weights, opts, whole, "target")
    asked = []
    rows = loaded.weights.rows

    def counted(name, ids):
        asked.append(len(ids))
        return rows(name, ids)

    monkeypatch.setattr(loaded.weights, "rows", counted)
    monkeypatch.setattr(target_graph, "ROW_CHUNK", 8)
    monkeypatch.setattr(target_graph, "QUANTIZE_READ_BYTES", 4 * cfg.hidden_size * 20)  # chunks of 16 rows
    write_target_graph(cfg, loaded.weights, opts, chunked, "target")
    assert 16 in asked and cfg.vocab_size > 16
    for name in ("target.onnx", "target.onnx.data"):
        assert (whole / name).read_bytes() == (chunked / name).read_bytes(), name


def test_smoothed_weights_tell_a_shape_without_reading_the_tensor():
    """int4's smoothed view answers shape() from its base (a file header), so the chunked quantization of a large
    table never reads it whole (it did: 12.3 GiB peak converting Gemma 4 E4B, whose per-layer table is 11 GB as
    float32)."""
    from specrt.convert.smoothing import smooth_down_proj
    from specrt.models.tensor_source import WeightSource

    class Headers(WeightSource):  # shapes known, every read refused
        def __getitem__(self, name):
            raise AssertionError(f"{name} was read")

        def __iter__(self):
            return iter(["model.embed_tokens_per_layer.weight"])

        def __len__(self):
            return 1

        def shape(self, name):
            return (262144, 10752)

    smoothed = smooth_down_proj(Headers(), {})
    assert smoothed.shape("model.embed_tokens_per_layer.weight") == (262144, 10752)
