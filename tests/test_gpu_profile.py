"""GPU bundles (`convert --device cuda`) built and checked on a machine without a GPU: every family converts at int4
(and from a GGUF at gguf) with float16 activations and no CPU exactness machinery, is validated against torch on the
CPU provider, speculates greedily as it decodes plainly, and `specrt info --placement cuda` finds every node on a
CUDA kernel's fast path where the registration table says the kernels exist (convert/ort_kernels.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from specrt.cli import main
from specrt.convert.onnx_graph import walk_nodes
from specrt.convert.placement import place_model, summarize
from tests.oracle_drafters import OracleDrafter
from tests.test_gguf_exact import mixed_gguf  # noqa: F401 (a fixture)
from tests.tiny_models import convert_tiny, save_tiny_bundle_source

# every family of the registry, its tiny checkpoint; those whose GPU graph is not yet wholly on the GPU say why
FAMILIES = {
    "llama": "",
    "qwen3_5_text": "",
    "qwen3_moe": "",
    "gpt_oss": "",
    "gemma4_text": "",
    "gemma4_moe": "",  # gated-GELU experts, which no MoE/QMoE kernel has: gathered (convert/gemma4_graph.py)
    "phi3": "",
    "smollm3": "",
    "lfm2": "",  # short convolutions: CausalConvWithState, as Gated DeltaNet's conv
}
CPU_MACHINERY = {"Pad", "Range", "Scan", "If"}  # attention-rows padding, exact attention, the experts' Scan


@pytest.fixture(scope="module")
def gpu_bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    return {arch: convert_tiny(arch, root, f"{arch}-cuda", "--device", "cuda") for arch in FAMILIES}


@pytest.mark.parametrize("arch", FAMILIES)
def test_gpu_graph_is_float16_without_cpu_machinery(gpu_bundles, arch):
    bundle = gpu_bundles[arch]
    manifest = json.loads((bundle / "specrt.json").read_text())
    assert manifest["target"]["device"] == "cuda" and manifest["kv"]["dtype"] == "float16"
    assert manifest["execution_providers"][0] == "CUDAExecutionProvider"
    assert not {"attention_bias", "attention_min_rows", "experts_token_by_token"} & set(manifest["target"]["inputs"])
    assert "total_sequence_length" in manifest["target"]["inputs"]
    model = onnx.load(str(bundle / "target.onnx"), load_external_data=False)
    ops = {n.op_type for n in walk_nodes(model.graph)}
    assert not (CPU_MACHINERY - ({"If"} if FAMILIES[arch] else set())) & ops
    for node in walk_nodes(model.graph):
        if node.op_type in ("MatMulNBits", "QMoE"):
            assert all(a.i == 0 for a in node.attribute if a.name == "accuracy_level")
    kv = next(i for i in model.graph.input if i.name.startswith("past_key_values"))
    assert kv.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    # validated against torch on the same quantized weights, at float16's limit, on the CPU provider
    checked = manifest["provenance"]["validation"]["quantized_reference"]
    assert checked["max_abs_diff"] < 5e-2 and checked["top1_agreement"] >= 0.95


@pytest.mark.parametrize("arch", FAMILIES)
def test_placement_cuda_every_node_on_the_gpu(gpu_bundles, arch):
    summary = summarize(place_model(gpu_bundles[arch] / "target.onnx", "cuda"))
    assert summary.by_verdict.get("gpu", 0) > 0
    assert summary.clean, [(p.verdict, p.op, p.reason) for p in summary.off_gpu]
    assert summary.strict  # nothing ONNX Runtime would move to the CPU: disable_cpu_ep_fallback can be on


def test_placement_finds_what_a_cpu_bundle_would_lose_on_cuda(gpu_bundles, tmp_path):
    """The same model converted for the CPU: float32 attention has no CUDA kernel, its exactness padding is there."""
    src = gpu_bundles["llama"].parent / "llama-src"
    cpu = tmp_path / "cpu"
    assert main(["convert", str(src), "-o", str(cpu), "--precision", "int4", "--max-context", "96"]) == 0
    placements = place_model(cpu / "target.onnx", "cuda")
    fallback = {p.op for p in placements if p.verdict == "cpu-fallback"}
    # the total length from Shape(attention_mask) (and the row padding's arithmetic): moved to the CPU
    assert {"Gather", "Cast"} <= {p.op for p in placements if p.verdict == "cpu-shape"}
    slow = {p.op for p in placements if p.verdict == "gpu-slow"}
    assert "com.microsoft.GroupQueryAttention" in fallback  # float32: CUDA registers float16/bfloat16 only
    assert "com.microsoft.MatMulNBits" in slow  # float32 activations: dequantize-then-GEMM


def test_placement_cli_and_migraphx_refusals(gpu_bundles, capsys):
    assert main(["info", str(gpu_bundles["llama"]), "--no-hash", "--placement", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "nodes under CUDAExecutionProvider" in out and "0 cpu-fallback" in out
    assert main(["info", str(gpu_bundles["qwen3_5_text"]), "--no-hash", "--placement", "migraphx"]) == 0
    out = capsys.readouterr().out
    assert "GatedDeltaNet" in out and "cpu-fallback" in out  # MIGraphX has no Gated DeltaNet


def _float32_twin_bundle(bundle: Path, out: Path) -> Path:
    """A copy of a GPU bundle whose target graph is its float32 twin (convert/gpu_profile.float32_twin)."""
    import shutil

    from specrt.bundle import file_entry
    from specrt.convert.gpu_profile import float32_twin

    shutil.copytree(bundle, out)
    manifest = json.loads((out / "specrt.json").read_text())
    manifest["kv"]["dtype"] = "float32"
    graphs = ["target.onnx"]
    for drafter in manifest.get("drafters", []):  # a float16 drafter graph too (the assistant reads the target's cache)
        if drafter.get("kv", {}).get("dtype") == "float16":
            drafter["kv"]["dtype"] = "float32"
            graphs.append(drafter["graph"]["file"])
    for graph in graphs:
        (out / graph).unlink()
        (out / f"{graph}.data").unlink()
        float32_twin(bundle / graph, out / graph)
        for name in (graph, f"{graph}.data"):
            entry = file_entry(out / name)
            manifest["files"][name] = {"size": entry.size, "sha256": entry.sha256}
    (out / "specrt.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_gpu_graphs_float_twin_speculates_as_it_decodes(gpu_bundles, tmp_path, arch):
    """The GPU graph's structure at float32 on the CPU (its float twin: same nodes, same weights): greedy speculation
    with drafts right and wrong equals plain decoding token for token, every family. (The float16 graph itself can
    part from plain decoding where logits nearly tie, since a call of several tokens rounds otherwise than a call of
    one: the tiny Gemma 4s do within 48 tokens; bench/gpu_families.py records where.)"""
    import specrt
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(str(_float32_twin_bundle(gpu_bundles[arch], tmp_path / "twin")), device="cpu",
                         drafter="none")
    assert engine.target.np_dtype == np.float32
    _assert_speculation_equals_plain(engine, SamplingParams(max_new_tokens=48, stop_token_ids=()), arch)


def _assert_speculation_equals_plain(engine, params, label) -> None:
    """Greedy output with drafts always right and always wrong equals plain decoding's, on two prompts."""
    for prompt in ("the a of to in and is", "time year people way day man thing"):
        engine.reset()
        plain = engine.generate(prompt, params, drafter=None).wait().token_ids
        n = len(engine.prompt_ids(prompt))
        for mode in ("right", "wrong"):
            engine.reset()
            spec = engine.generate(prompt, params, drafter=OracleDrafter(n, plain, engine.manifest.vocab_size, mode)).wait()
            assert spec.token_ids == plain, (label, mode)


@pytest.mark.parametrize("arch", ["llama", "qwen3_5_text", "gpt_oss"])
def test_gpu_bundle_speculates_as_it_decodes_on_the_cpu(gpu_bundles, arch):
    """The float16 graph on the CPU provider: greedy speculation (drafts right and wrong) equals plain decoding."""
    import specrt
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(str(gpu_bundles[arch]), device="cpu", drafter="none")
    _assert_speculation_equals_plain(engine, SamplingParams(max_new_tokens=20, stop_token_ids=()), arch)


def test_gpu_bundle_refuses_batch_invariant_and_trees(gpu_bundles):
    import specrt
    from specrt.errors import SpecrtError

    engine = specrt.load(str(gpu_bundles["llama"]), device="cpu", drafter="none")
    with pytest.raises(SpecrtError, match="batch-invariant"):
        engine.batch_invariant = True
    with pytest.raises(SpecrtError, match="tree"):
        engine.target.forward(np.array([[1, 2]]), attention_bias=np.zeros((1, 1, 2, 2), np.float16))


def test_fp32_for_a_gpu_is_refused_in_one_line(gpu_bundles, tmp_path, capsys):
    src = str(gpu_bundles["llama"].parent / "llama-src")
    assert main(["convert", src, "-o", str(tmp_path / "a"), "--device", "cuda", "--precision", "fp32"]) == 2
    assert "float16" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_a_gguf_keeps_its_blocks_on_the_gpu(mixed_gguf, tmp_path):
    """--precision gguf for CUDA: the file's own blocks (Q4_0 ... Q6_K, minimums included) in float16 graphs, every
    node on CUDA's fast path."""
    path, _, _ = mixed_gguf
    bundle = tmp_path / "gguf-cuda"
    assert main(["convert", str(path), "-o", str(bundle), "--device", "cuda", "--max-context", "96"]) == 0
    manifest = json.loads((bundle / "specrt.json").read_text())
    assert manifest["target"]["precision"] == "gguf" and manifest["kv"]["dtype"] == "float16"
    summary = summarize(place_model(bundle / "target.onnx", "cuda"))
    assert summary.clean, [(p.verdict, p.op, p.reason) for p in summary.off_gpu]


@pytest.mark.parametrize("arch, runs", [("llama", True), ("qwen2", True), ("gemma4_text", True),
                                        ("qwen3_5_text", False), ("gpt_oss", False)])
def test_rocm_converts_what_migraphx_runs_and_refuses_the_rest_in_one_line(gpu_bundles, tmp_path, capsys, arch, runs):
    """MIGraphX: a dense model's graph is wholly its own, written as its parsers read it (AMDMIGraphX f729a52: a float
    embedding table, MatMulNBits with 4 inputs and the bias after it, rotary outside GroupQueryAttention, whose parser
    ignores position_ids, and seqlens_k in place of the growing attention_mask), and it speculates as it decodes; a
    Gated DeltaNet hybrid or gpt-oss (QMoE, attention sinks) is refused at conversion, naming what MIGraphX lacks."""
    import specrt
    from specrt.runtime.sampling import SamplingParams

    src = gpu_bundles[arch].parent / f"{arch}-src" if arch in gpu_bundles else None
    src = str(src or save_tiny_bundle_source(arch, tmp_path / f"{arch}-src"))
    code = main(["convert", src, "-o", str(tmp_path / "r"), "--device", "rocm", "--precision", "int4",
                 "--max-context", "96"])
    if runs:
        assert code == 0
        graph = tmp_path / "r" / "target.onnx"
        assert summarize(place_model(graph, "migraphx")).clean
        model = onnx.load(str(graph), load_external_data=False)
        assert [i.name for i in model.graph.input][:4] == ["input_ids", "position_ids", "seqlens_k",
                                                            "total_sequence_length"]
        for node in walk_nodes(model.graph):
            if node.op_type == "GroupQueryAttention":
                assert len(node.input) == 7 and all(a.i == 0 for a in node.attribute if a.name == "do_rotary")
            if node.op_type == "MatMulNBits":
                assert len(node.input) == 4
        engine = specrt.load(str(tmp_path / "r"), device="cpu", drafter="none")
        params = SamplingParams(max_new_tokens=16, stop_token_ids=())
        plain = engine.generate("the a of to in", params, drafter=None).wait().token_ids
        engine.reset()
        oracle = OracleDrafter(len(engine.prompt_ids("the a of to in")), plain, engine.manifest.vocab_size, "right")
        assert engine.generate("the a of to in", params, drafter=oracle).wait().token_ids == plain
    else:
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "MIGraphX cannot run" in errors[0]
        assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "assistant"])
def test_feature_heads_are_built_for_the_gpu_and_draft_losslessly(tmp_path, kind):
    """EAGLE-3 heads, MTP modules and Gemma 4's assistant (which reads the target's float16 cache) in a GPU bundle
    compute in float16 like their target, every node on CUDA, and draft (greedy output equal to plain decoding on the
    CPU provider; the assistant's tiny Gemma 4 target on the bundle's float32 twin, whose tokens do not part at
    float16 near-ties)."""
    import specrt
    from specrt.models.eagle3 import save_eagle3_checkpoint, state_dict_of
    from specrt.runtime.sampling import SamplingParams
    from tests.test_eagle3 import random_head
    from tests.test_mtp import make_target
    from tests.tiny_models import hf_assistant

    if kind == "assistant":  # the ordered head form (centroids), E2B/E4B's
        src = save_tiny_bundle_source("gemma4_text", tmp_path / "target")
        hf_assistant(ordered=True).save_pretrained(tmp_path / "head")
        drafter = f"assistant:{tmp_path / 'head'}"
    elif kind == "eagle3":
        src = save_tiny_bundle_source("llama", tmp_path / "target")
        head = random_head(3)
        save_eagle3_checkpoint(tmp_path / "head", head.cfg, state_dict_of(head))
        drafter = f"eagle3:{tmp_path / 'head'}"
    else:
        src, drafter = make_target(tmp_path / "target", "deepseek", seed=10, own_head=True), "mtp"
    bundle = tmp_path / "bundle"
    assert main(["convert", str(src), "-o", str(bundle), "--max-context", "96", "--precision", "int4",
                 "--device", "cuda", "--drafter", drafter]) == 0
    entry = json.loads((bundle / "specrt.json").read_text())["drafters"][0]
    assert entry["kv"]["dtype"] == "float16" and entry["validation"]["max_abs_diff"] < 5e-2
    summary = summarize(place_model(bundle / entry["graph"]["file"], "cuda"))
    assert summary.strict, [(p.verdict, p.op, p.reason) for p in summary.off_gpu]
    params = SamplingParams(max_new_tokens=16, stop_token_ids=())
    if kind == "assistant":  # it drafts from the float16 cache and features as shipped, then on the twin
        spec = specrt.load(str(bundle), device="cpu", drafter=kind, draft_length=3).generate("the a", params).wait()
        assert sum(spec.stats.drafted_by_position) > 0
        bundle = _float32_twin_bundle(bundle, tmp_path / "twin")
    plain = specrt.load(str(bundle), device="cpu", drafter="none").generate("the a of to", params).wait()
    spec = specrt.load(str(bundle), device="cpu", drafter=kind, draft_length=3).generate("the a of to", params).wait()
    assert spec.token_ids == plain.token_ids and sum(spec.stats.drafted_by_position) > 0


def _quantized_gguf(arch: str, path: Path) -> None:
    """The tiny model as llama.cpp's converter writes it, every matrix of whole blocks in Q4_0 (Q8_0 for the
    Qwen3.5 hybrid, whose value heads are reordered by the block) and the rest as llama.cpp keeps it."""
    import gguf

    from tests import gguf_writer
    from tests.tiny_models import WORDS, hf_model

    kind = gguf.GGMLQuantizationType.Q8_0 if arch.startswith("qwen3_5") else gguf.GGMLQuantizationType.Q4_0

    def encode(name, data):
        if data.ndim == 2 and data.shape[1] % 32 == 0 and data.shape[0] > 1:
            return gguf.quants.quantize(np.ascontiguousarray(data, np.float32), kind), kind
        return data, None

    model = hf_model(arch)
    hf, tokens = model.config.to_dict(), ["<|endoftext|>"] + list(WORDS[1:97])
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if arch.startswith("gemma4"):
        from specrt.models.gemma4 import expert_view

        gguf_writer.write_gemma4_gguf(path, hf, expert_view(weights), tokens, eos=4, encode=encode)
    elif arch.startswith("qwen3_5"):
        gguf_writer.write_qwen35_gguf(path, hf, weights, tokens, eos=4, encode=encode)
    elif arch == "gpt_oss":  # its experts as published (MXFP4 read exactly), the rest float
        gguf_writer.write_gpt_oss_gguf(path, hf, weights, tokens, eos=4)
    else:  # the checkpoint's own per-expert names, as saved
        from safetensors.numpy import load_file

        model.save_pretrained(path.parent / "hf")
        weights = load_file(str(path.parent / "hf" / "model.safetensors"))
        gguf_writer.write_qwen3moe_gguf(path, hf, weights, tokens, eos=4, encode=encode)


@pytest.mark.parametrize("arch", ["qwen3_5_text_heads32", "qwen3_moe_sparse", "gpt_oss", "gemma4_text", "gemma4_moe"])
def test_every_familys_gguf_converts_for_cuda_wholly_on_the_gpu(tmp_path, arch):
    """`--precision gguf --device cuda` from llama.cpp's layout of each family: the file's blocks in float16 graphs,
    validated, and every node on a CUDA fast path."""
    path = tmp_path / "m.gguf"
    _quantized_gguf(arch, path)
    bundle = tmp_path / "b"
    assert main(["convert", str(path), "-o", str(bundle), "--precision", "gguf", "--device", "cuda",
                 "--max-context", "96"]) == 0
    manifest = json.loads((bundle / "specrt.json").read_text())
    assert manifest["kv"]["dtype"] == "float16" and manifest["target"]["device"] == "cuda"
    summary = summarize(place_model(bundle / "target.onnx", "cuda"))
    assert summary.strict, [(p.verdict, p.op, p.reason) for p in summary.off_gpu]


def test_a_catalog_model_on_a_gpu_gets_a_bundle_of_the_gpu_profile(monkeypatch, tmp_path):
    """specrt.load / chat on a GPU converts a catalog model in the GPU profile, into a cache folder of its own, and
    converts again a cached bundle built for another device (the conversion itself is stood in for)."""
    from specrt.app import api
    from specrt.catalog import DEFAULT_MODEL
    from specrt.runtime.providers import profile_of

    assert profile_of(["CUDAExecutionProvider", "CPUExecutionProvider"]) == "cuda"
    assert profile_of(["MIGraphXExecutionProvider", "CPUExecutionProvider"]) == "rocm"
    assert profile_of(["CPUExecutionProvider"]) == "cpu"
    asked = []
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path))
    monkeypatch.setattr(api, "_convert_catalog", lambda model, bundle, precision, spec, stages, device="cpu":
                        asked.append((bundle.name, device)))
    api.resolve_bundle(DEFAULT_MODEL, "int4", device="cuda")
    api.resolve_bundle(DEFAULT_MODEL, "int4")
    assert asked == [(f"{DEFAULT_MODEL}-int4-cuda", "cuda"), (f"{DEFAULT_MODEL}-int4", "cpu")]


def test_dflash_is_built_for_the_gpu_and_drafts_losslessly(tmp_path):
    """A DFlash drafter with a confidence head beside a GPU target: float16 like it, every node on CUDA (its lengths
    are host inputs, so no shape arithmetic), validated against torch at float16's limit; its accept_logits for a
    block cut short by the context's end agree with the CPU bundle's; it drafts from the float16 graph as shipped,
    and its greedy speculation on the bundle's float32 twin equals plain decoding."""
    import onnxruntime as ort

    import specrt
    from specrt.dflash_io import call_feeds
    from specrt.models.dflash_confidence import save_confidence_head
    from specrt.runtime.sampling import SamplingParams
    from tests.test_dflash import random_draft, write_reference_checkpoint
    from tests.test_dflash_confidence import random_head

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    model = random_draft(5)
    write_reference_checkpoint(tmp_path / "drafter", model)
    save_confidence_head(tmp_path / "drafter", random_head(1))
    bundles = {}
    for device in ("cuda", "cpu"):
        bundles[device] = tmp_path / device
        assert main(["convert", str(src), "-o", str(bundles[device]), "--max-context", "96", "--precision", "int4",
                     "--device", device, "--drafter", f"dflash:{tmp_path / 'drafter'}"]) == 0
    entry = json.loads((bundles["cuda"] / "specrt.json").read_text())["drafters"][0]
    assert entry["kv"]["dtype"] == "float16" and entry["validation"]["max_abs_diff"] < 5e-2
    summary = summarize(place_model(bundles["cuda"] / entry["graph"]["file"], "cuda"))
    assert summary.strict, [(p.verdict, p.op, p.reason) for p in summary.off_gpu]

    cfg, rng = model.cfg, np.random.default_rng(2)
    ids = np.array([[7, cfg.mask_token_id]])  # a block of 2
    feats = rng.normal(size=(1, 3, cfg.feature_width)).astype(np.float32)
    past = [np.zeros((1, cfg.layers.num_kv_heads, 0, cfg.layers.head_dim), np.float32)] * (2 * cfg.layers.num_layers)
    accept = {}
    for device, bundle in bundles.items():
        session = ort.InferenceSession(str(bundle / entry["graph"]["file"]), providers=["CPUExecutionProvider"])
        accept[device] = session.run(None, call_feeds(session, ids, feats, np.arange(5)[None], past))[-1]
    assert accept["cuda"].shape == (1, 1)
    np.testing.assert_allclose(accept["cuda"], accept["cpu"], atol=5e-2)

    params = SamplingParams(max_new_tokens=16, stop_token_ids=())
    shipped = specrt.load(str(bundles["cuda"]), device="cpu", drafter="dflash", draft_length=3)
    assert sum(shipped.generate("the a", params).wait().stats.drafted_by_position) > 0
    twin = _float32_twin_bundle(bundles["cuda"], tmp_path / "twin")
    plain = specrt.load(str(twin), device="cpu", drafter="none").generate("the a of to", params).wait()
    spec = specrt.load(str(twin), device="cpu", drafter="dflash", draft_length=3).generate("the a of to", params).wait()
    assert spec.token_ids == plain.token_ids and sum(spec.stats.drafted_by_position) > 0
