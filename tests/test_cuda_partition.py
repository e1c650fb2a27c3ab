"""The placement check held to onnxruntime-gpu's own partitioner (bench/cuda_partition.py: its CUDA provider set up
on stand-in CUDA libraries, no GPU): for every family, converted for the CPU and for CUDA, the nodes `specrt info
--placement cuda` says the CPU runs are exactly those ONNX Runtime gives the CPU, and every GPU bundle opens with
`session.disable_cpu_ep_fallback` on. Full tier: it downloads onnxruntime-gpu's wheel (about 255 MB, once) and
compiles the stand-ins with gcc."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from specrt.convert.placement import place_model
from tests.tiny_models import convert_tiny

pytestmark = pytest.mark.full
ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("llama", "qwen3_5_text", "qwen3_moe", "gpt_oss", "gemma4_text", "gemma4_moe")


@pytest.fixture(scope="module")
def partitioner():
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in CUDA libraries")
    spec = importlib.util.spec_from_file_location("cuda_partition", ROOT / "bench" / "cuda_partition.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.partition


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("partition")
    return {(arch, device): convert_tiny(arch, root, f"{arch}-{device}", "--device", device) / "target.onnx"
            for arch in FAMILIES for device in ("cpu", "cuda")}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_predicted_cpu_nodes_are_onnx_runtimes(partitioner, bundles, arch, device):
    graph = bundles[arch, device]
    real = partitioner(graph)
    assert not real["error"], real["error"]
    on_cpu = set(real["nodes"].get("CPUExecutionProvider", []))
    predicted = {p.node for p in place_model(graph, "cuda") if p.verdict in ("cpu-fallback", "cpu-shape")}
    assert on_cpu == predicted
    if device == "cpu":
        assert on_cpu  # float32 attention has no CUDA kernel: the check has something to find


@pytest.mark.parametrize("arch", FAMILIES)
def test_gpu_bundles_open_with_cpu_fallback_disabled(partitioner, bundles, arch):
    real = partitioner(bundles[arch, "cuda"], strict=True)
    assert not real["error"], real["error"]
    assert list(real["nodes"]) == ["CUDAExecutionProvider"]
