"""Mixture-of-experts targets (Qwen3-MoE; Qwen3.5-MoE, the hybrid with a shared expert and an MoE block in its MTP
module) on tiny random checkpoints built from transformers' own classes, in the published per-expert layouts: plain
decoding equals transformers, int8 / int4 experts (QMoE) are held to torch on the same quantized weights,
speculation is lossless, and bad sources are named in one line."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specrt.cli import main
from specrt.convert.onnx_graph import walk_nodes
from specrt.runtime.sampling import SamplingParams
from tests.test_qwen3_5 import add_mtp, assert_gguf_converts_and_mtp_drafts
from tests.tiny_models import (
    assert_greedy_equals_transformers, assert_ids_decode_as_transformers, assert_refused_in_one_line, edit_config,
    hf_model, read_config, save_tiny_bundle_source,
)

PROMPTS = ("the cat and the dog", "a man in the house of the world", "what is the time of day for you")
GREEDY = SamplingParams(max_new_tokens=64, stop_token_ids=())
ARCHS = ("qwen3_moe", "qwen3_moe_unnormalized")
HYBRID_MOE = ("qwen3_5_moe", "qwen3_5_moe_text")  # the published multimodal layout and the text-only one


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_moe")
    out = {arch: save_tiny_bundle_source(arch, root / arch) for arch in ARCHS}
    out["qwen3"] = save_tiny_bundle_source("qwen3", root / "qwen3", seed=3)  # a dense drafter, same tokenizer
    out["eagle3"], out["dflash"] = write_eagle3_and_dflash(root)
    for arch in HYBRID_MOE:  # with random MTP weights in the published names (its block: gated attention + MoE)
        out[arch] = add_mtp(save_tiny_bundle_source(arch, root / arch))
    return out


@pytest.fixture(scope="module")
def bundles(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_moe_bundles")
    out = {arch: root / arch for arch in ARCHS}
    assert main(["convert", str(sources["qwen3_moe"]), "-o", str(out["qwen3_moe"]), "--max-context", "128",
                 "--drafter", f"draft-model:{sources['qwen3']}", "--drafter", f"eagle3:{sources['eagle3']}",
                 "--drafter", f"dflash:{sources['dflash']}"]) == 0
    assert main(["convert", str(sources["qwen3_moe_unnormalized"]), "-o", str(out["qwen3_moe_unnormalized"]),
                 "--max-context", "128"]) == 0
    for arch in HYBRID_MOE:
        out[arch] = root / arch
        assert main(["convert", str(sources[arch]), "-o", str(out[arch]), "--max-context", "128",
                     "--drafter", "mtp"]) == 0
    return out


def test_the_config_says_which_layers_are_sparse(sources):
    from specrt.models.config import config_from_hf

    cfg = config_from_hf(read_config(sources["qwen3_moe"]))
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (8, 2, 32)
    assert cfg.moe_layers == (0, 2) and cfg.norm_topk_prob and cfg.qk_norm
    assert not config_from_hf(read_config(sources["qwen3_moe_unnormalized"])).norm_topk_prob


@pytest.mark.parametrize("arch", ARCHS + HYBRID_MOE)
def test_plain_greedy_equals_transformers(bundles, arch):
    """64 greedy tokens per prompt, each transformers' own argmax after the same prefix."""
    import onnx

    import specrt

    ops = {n.op_type for n in walk_nodes(onnx.load(str(bundles[arch] / "target.onnx"), load_external_data=False).graph)}
    assert "MoE" in ops
    engine = specrt.load(str(bundles[arch]), device="cpu")
    model = hf_model(arch)
    assert_greedy_equals_transformers(engine, model, PROMPTS, GREEDY)


def write_eagle3_and_dflash(root):
    """A random EAGLE-3 head (vLLM's layout, reading the outputs of layers 2, 1, 0) and a random DFlash drafter
    (z-lab's layout, reading layers 0 and 2) for a 64-wide target of 97 tokens and at least 3 layers."""
    from specrt.models.eagle3 import save_eagle3_checkpoint, state_dict_of
    from tests.test_dflash import random_draft, write_reference_checkpoint
    from tests.test_eagle3 import random_head

    head = random_head(3)
    save_eagle3_checkpoint(root / "eagle3", head.cfg, state_dict_of(head))
    write_reference_checkpoint(root / "dflash", random_draft(3))
    return root / "eagle3", root / "dflash"


def speculate_with_every_drafter(bundle, names):
    """Greedy output of each named drafter at fixed lengths 1 and 4 equals plain decoding's, token for token, and
    every drafter drafted."""
    import specrt
    from specrt.app.api import make_drafter

    engine = specrt.load(str(bundle), device="cpu")
    engine.adaptive = False
    drafters = {n: make_drafter(n, bundle, engine.manifest, ["CPUExecutionProvider"]) for n in names}
    drafted = dict.fromkeys(drafters, 0)
    for prompt in PROMPTS:
        engine.reset()
        plain = engine.generate(prompt, GREEDY, drafter=None).wait().token_ids
        for name, drafter in drafters.items():
            for k in (1, 4):
                engine.draft_length = k
                engine.reset()
                spec = engine.generate(prompt, GREEDY, drafter=drafter).wait()
                assert spec.token_ids == plain, (name, k, prompt)
                drafted[name] += sum(spec.stats.drafted_by_position)
    assert all(drafted.values()), drafted


def test_speculation_on_a_mixture_of_experts_is_lossless(bundles):
    """ngram, a dense Qwen3 draft model (same tokenizer), an EAGLE-3 head and a DFlash drafter over Qwen3-MoE."""
    speculate_with_every_drafter(bundles["qwen3_moe"], ("ngram", "draft-model", "eagle3", "dflash"))


def test_mtp_with_an_moe_block_speculates_losslessly(bundles):
    """Qwen3.6-35B-A3B's kind of MTP module (gated attention + the target's MoE with a shared expert), chained for
    k = 1, 2, 3, and ngram, over the recurrent target: greedy output equals plain decoding."""
    import specrt
    from specrt.app.api import make_drafter

    bundle = bundles["qwen3_5_moe"]
    engine = specrt.load(str(bundle), device="cpu")
    engine.adaptive = False
    drafters = {n: make_drafter(n, bundle, engine.manifest, ["CPUExecutionProvider"]) for n in ("mtp", "ngram")}
    drafted = dict.fromkeys(drafters, 0)
    for prompt in PROMPTS:
        engine.reset()
        plain = engine.generate(prompt, GREEDY, drafter=None).wait().token_ids
        for name, k in (("mtp", 1), ("mtp", 2), ("mtp", 3), ("ngram", 3)):
            engine.draft_length = k
            engine.reset()
            spec = engine.generate(prompt, GREEDY, drafter=drafters[name]).wait()
            assert spec.token_ids == plain, (name, k, prompt)
            drafted[name] += sum(spec.stats.drafted_by_position)
    assert all(drafted.values()), drafted


@pytest.mark.parametrize("arch", ARCHS + ("qwen3_5_moe_text",))
@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_experts_are_validated_and_exact(sources, tmp_path, arch, precision):
    """int8 / int4 experts in QMoE (int8: one scale per row; int4: blocks of 32) held to torch running the very same
    quantized weights (read back from the data file); in batch-invariant mode greedy speculation equals plain."""
    import onnx

    import specrt
    from specrt.bundle import load_bundle
    from specrt.models.config import config_from_hf

    out = tmp_path / precision
    assert main(["convert", str(sources[arch]), "-o", str(out), "--precision", precision,
                 "--max-context", "128"]) == 0
    graph = onnx.load(str(out / "target.onnx"), load_external_data=False).graph
    qmoe = [n for n in walk_nodes(graph) if n.op_type == "QMoE"]
    assert len(qmoe) == len(config_from_hf(read_config(sources[arch])).moe_layers)
    bits = {a.name: a.i for a in qmoe[0].attribute}["expert_weight_bits"]
    assert bits == int(precision[3:])
    validation = load_bundle(out).provenance["validation"]
    assert validation["quantized_reference"]["max_abs_diff"] < 1e-3
    engine = specrt.load(str(out), device="cpu", drafter="ngram", batch_invariant=True)
    params = SamplingParams(max_new_tokens=32, stop_token_ids=())
    for prompt in PROMPTS[:2]:
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids



def _rewrite(src, change):
    tensors = load_file(str(src / "model.safetensors"))
    save_file(change(tensors), str(src / "model.safetensors"))


def _drop(name):
    return lambda src: _rewrite(src, lambda t: {k: v for k, v in t.items() if k != name})


@pytest.mark.parametrize("edit, message", [
    (lambda s: edit_config(s, num_experts=6),
     r"layer 0 has tensor model.layers.0.mlp.experts.6.gate_proj.weight, but the config says num_experts = 6"),
    (lambda s: edit_config(s, num_experts=10),
     r"tensor model.layers.0.mlp.gate.weight has shape \(8, 64\), expected \(10, 64\)"),
    (lambda s: edit_config(s, num_experts_per_tok=9), "num_experts_per_tok = 9 must be between 1 and num_experts"),
    (_drop("model.layers.2.mlp.experts.5.down_proj.weight"), "missing tensor model.layers.2.mlp.experts.5.down_proj"),
    (lambda s: _rewrite(s, lambda t: {**t, "model.layers.0.mlp.experts.3.up_proj.weight":
                                      np.ascontiguousarray(t["model.layers.0.mlp.experts.3.up_proj.weight"][:16])}),
     r"tensor model.layers.0.mlp.experts.3.up_proj.weight has shape \(16, 64\), expected \(32, 64\)"),
])
def test_bad_moe_sources_are_named(sources, tmp_path, capsys, edit, message):
    src = tmp_path / "src"
    shutil.copytree(sources["qwen3_moe"], src)
    edit(src)
    out = tmp_path / "out"
    assert_refused_in_one_line(["convert", str(src), "-o", str(out)], out, capsys, message)


def _q8_0(gname, w):
    import gguf

    if w.ndim >= 2:
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return w, None


@pytest.mark.parametrize("encode", [None, _q8_0], ids=["f32", "q8_0"])
def test_gguf_in_llama_cpps_qwen3moe_layout_reads_every_expert(tmp_path, encode):
    """llama.cpp's qwen3moe layout (stacked expert tensors, the router as ffn_gate_inp, expert counts in the
    metadata): every expert's matrix read back as written (Q8_0: as gguf dequantizes it), and the F32 file's bundle
    decodes as transformers does."""
    import gguf

    import specrt
    from specrt.models.gguf_loader import load_gguf
    from tests.gguf_writer import write_qwen3moe_gguf
    from tests.tiny_models import WORDS

    model = hf_model("qwen3_moe")
    hf = model.config.to_dict()
    src = tmp_path / "hf"
    model.save_pretrained(src)
    weights = load_file(str(src / "model.safetensors"))
    write_qwen3moe_gguf(tmp_path / "m.gguf", hf, weights, ["<|endoftext|>"] + list(WORDS[1:97]), eos=4, encode=encode)
    got_hf, loaded, _ = load_gguf(tmp_path / "m.gguf")
    assert (got_hf["num_experts"], got_hf["num_experts_per_tok"], got_hf["moe_intermediate_size"]) == (8, 2, 32)
    for name, w in weights.items():
        want = w if encode is None or w.ndim < 2 else gguf.quants.dequantize(
            gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
        np.testing.assert_allclose(loaded[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
    if encode is not None:
        return
    out = tmp_path / "bundle"
    assert main(["convert", str(tmp_path / "m.gguf"), "-o", str(out), "--max-context", "128"]) == 0
    engine = specrt.load(str(out), device="cpu")
    assert_ids_decode_as_transformers(engine, model)


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused-gate-up"])
def test_gguf_in_llama_cpps_qwen35moe_layout_converts_and_drafts_with_its_moe_mtp(sources, tmp_path, fused):
    """llama.cpp's qwen35moe layout (qwen35's hybrid names and transforms, the experts stacked per projection or
    gate and up fused, the shared expert and its gate, the MTP module's MoE block after the layers): every tensor
    read back as the HF checkpoint's, the bundle decodes as transformers does and the MTP module drafts
    losslessly."""
    from specrt.models.gguf_loader import load_gguf
    from specrt.models.hf_loader import load_hf_folder
    from tests.gguf_writer import write_qwen35_gguf
    from tests.tiny_models import WORDS

    hf, lazy = load_hf_folder(sources["qwen3_5_moe_text"])
    weights = {name: lazy[name] for name in lazy}
    write_qwen35_gguf(tmp_path / "m.gguf", hf, weights, ["<|endoftext|>"] + list(WORDS[1:97]), eos=4, mtp_layers=1,
                      fused_experts=fused)
    got, loaded, _ = load_gguf(tmp_path / "m.gguf")
    assert got["model_type"] == "qwen3_5_moe_text" and got["num_experts"] == hf["num_experts"]
    # expert_shared_feed_forward_length is optional: without it the shared expert's own rows give its width
    from specrt.archs import qwen3_5_gguf as gguf_qwen35
    from specrt.models.gguf_loader import field_value, open_gguf

    reader = open_gguf(tmp_path / "m.gguf")
    without = lambda r, key, default=None: (  # noqa: E731
        default if key.endswith("expert_shared_feed_forward_length") else field_value(r, key, default))
    assert gguf_qwen35.hf_config(reader, without, gguf_qwen35.MOE_ARCH)["shared_expert_intermediate_size"] == \
        hf["shared_expert_intermediate_size"] > 0
    assert set(loaded) == set(weights)
    for name, w in weights.items():
        np.testing.assert_allclose(loaded[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
    assert_gguf_converts_and_mtp_drafts(tmp_path / "m.gguf", tmp_path / "bundle", hf_model("qwen3_5_moe_text"))


@pytest.mark.parametrize("edit, message", [
    (dict(num_experts=6), "layer 0 has tensor model.layers.0.mlp.experts.6.gate_proj.weight, but the config says "
                          "num_experts = 6"),
    (dict(moe_intermediate_size=16), r"tensor model.layers.0.mlp.experts.0.gate_proj.weight has shape \(32, 64\), "
                                     r"expected \(16, 64\)"),
])
def test_inconsistent_qwen35moe_gguf_metadata_is_named(sources, tmp_path, capsys, edit, message):
    """expert_count or expert_feed_forward_length that disagree with the stacked experts: one line naming the
    tensor, nothing written."""
    from specrt.models.hf_loader import load_hf_folder
    from tests.gguf_writer import write_qwen35_gguf
    from tests.tiny_models import WORDS

    hf, lazy = load_hf_folder(sources["qwen3_5_moe_text"])
    write_qwen35_gguf(tmp_path / "m.gguf", {**hf, **edit}, {n: lazy[n] for n in lazy},
                      ["<|endoftext|>"] + list(WORDS[1:97]), eos=4, mtp_layers=1, names_from=hf)
    out = tmp_path / "out"
    assert_refused_in_one_line(["convert", str(tmp_path / "m.gguf"), "-o", str(out)], out, capsys, message)
