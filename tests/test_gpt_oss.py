"""gpt-oss targets (attention sinks, sliding and full layers, yarn rope, biased experts with a clamped SwiGLU) on
tiny random checkpoints built from transformers' own class, in its bf16 layout and in the published MXFP4 one:
plain decoding equals transformers, MXFP4 experts are read exactly, int8 / int4 are held to torch on the same
quantized weights, speculation is lossless, and bad sources are named in one line."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from specrt.cli import main
from specrt.convert.onnx_graph import walk_nodes
from specrt.runtime.sampling import SamplingParams
from tests.test_qwen3_moe import speculate_with_every_drafter, write_eagle3_and_dflash
from tests.tiny_models import (
    assert_greedy_equals_transformers, assert_ids_decode_as_transformers, assert_refused_in_one_line, edit_config,
    hf_model, save_tiny_bundle_source,
)

PROMPTS = ("the cat and the dog", "a man in the house of the world", "what is the time of day for you")
GREEDY = SamplingParams(max_new_tokens=64, stop_token_ids=())


def to_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [..., K] (K a multiple of 32) -> (blocks uint8 [..., K / 32, 16], scales uint8 [..., K / 32]): each block's
    values rounded to the nearest e2m1 value times 2^(scale - 127), low nibble first."""
    from specrt.models.gpt_oss_layout import FP4_VALUES

    blocks = w.reshape(w.shape[:-1] + (-1, 32)).astype(np.float32)
    exponent = np.ceil(np.log2(np.maximum(np.abs(blocks).max(-1), 1e-30) / 6.0)).astype(np.int32)  # max -> <= 6
    scaled = blocks / np.ldexp(1.0, exponent)[..., None]
    codes = np.abs(scaled[..., None] - FP4_VALUES).argmin(-1).astype(np.uint8)  # [..., G, 32]
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exponent + 127).astype(np.uint8)


def write_mxfp4_twin(src, mxfp4_dir, bf16_dir):
    """From a bf16 gpt-oss folder: one folder whose experts are MXFP4 (the published layout) and one whose bf16
    experts hold exactly the MXFP4 values, every other tensor alike."""
    from specrt.models.gpt_oss_layout import dequantize_mxfp4

    tensors = load_file(str(src / "model.safetensors"))
    mx, bf = {}, {}
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            rows = np.ascontiguousarray(np.swapaxes(t.astype(np.float32), 1, 2))  # [E, out, in]
            blocks, scales = to_mxfp4(rows)
            mx[name + "_blocks"], mx[name + "_scales"] = blocks, scales
            exact = dequantize_mxfp4(blocks, scales)  # [E, out, in]
            bf[name] = np.ascontiguousarray(np.swapaxes(exact, 1, 2)).astype(t.dtype)
        else:
            mx[name] = bf[name] = t
    for folder, out in ((mxfp4_dir, mx), (bf16_dir, bf)):
        shutil.copytree(src, folder)
        save_file(out, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_oss")
    src = save_tiny_bundle_source("gpt_oss", root / "gpt_oss")
    write_mxfp4_twin(src, root / "mxfp4", root / "bf16-of-mxfp4")
    eagle3, dflash = write_eagle3_and_dflash(root)
    return {"gpt_oss": src, "mxfp4": root / "mxfp4", "bf16": root / "bf16-of-mxfp4",
            "qwen3": save_tiny_bundle_source("qwen3", root / "qwen3", seed=3), "eagle3": eagle3, "dflash": dflash}


@pytest.fixture(scope="module")
def bundle(sources, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt_oss_bundle") / "b"
    assert main(["convert", str(sources["gpt_oss"]), "-o", str(out), "--max-context", "128",
                 "--drafter", f"draft-model:{sources['qwen3']}", "--drafter", f"eagle3:{sources['eagle3']}",
                 "--drafter", f"dflash:{sources['dflash']}"]) == 0
    return out


def test_plain_greedy_equals_transformers(bundle):
    """64 greedy tokens per prompt (past the 4-token sliding window), each transformers' own argmax."""
    import onnx

    import specrt

    graph = onnx.load(str(bundle / "target.onnx"), load_external_data=False).graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 4 and all(len(n.input) == 12 and n.input[11] for n in attention)  # head_sink given
    assert sum(n.op_type == "MoE" for n in walk_nodes(graph)) == 4
    engine = specrt.load(str(bundle), device="cpu")
    model = hf_model("gpt_oss")
    assert_greedy_equals_transformers(engine, model, PROMPTS, GREEDY)


def test_mxfp4_dequantizes_as_transformers_does():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from specrt.models.gpt_oss_layout import dequantize_mxfp4

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(3, 8, 4, 16), dtype=np.uint8)
    scales = rng.integers(118, 134, size=(3, 8, 4), dtype=np.uint8)
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    ours = dequantize_mxfp4(blocks, scales)  # [E, rows, K]; transformers returns [E, K, rows]
    assert np.array_equal(np.swapaxes(ours, 1, 2), theirs.numpy())


def test_mxfp4_experts_read_exactly(sources, tmp_path):
    """The published MXFP4 layout converts to the very graph outputs of a bf16 folder holding the same values."""
    import specrt

    outs = {}
    for name in ("mxfp4", "bf16"):
        outs[name] = tmp_path / name
        assert main(["convert", str(sources[name]), "-o", str(outs[name]), "--max-context", "128"]) == 0
    engines = {name: specrt.load(str(path), device="cpu") for name, path in outs.items()}
    ids = np.array([engines["bf16"].prompt_ids(PROMPTS[1])])
    logits = {}
    for name, engine in engines.items():
        engine.reset()
        logits[name] = engine.target.forward(ids).copy()
    assert np.array_equal(logits["mxfp4"], logits["bf16"])


def test_speculation_on_gpt_oss_is_lossless(bundle):
    """ngram, a dense Qwen3 draft model, an EAGLE-3 head and a DFlash drafter (the kinds published for gpt-oss)."""
    speculate_with_every_drafter(bundle, ("ngram", "draft-model", "eagle3", "dflash"))


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_gpt_oss_is_validated_and_exact(sources, tmp_path, precision):
    import specrt
    from specrt.bundle import load_bundle

    out = tmp_path / precision
    assert main(["convert", str(sources["mxfp4"]), "-o", str(out), "--precision", precision,
                 "--max-context", "128"]) == 0
    assert load_bundle(out).provenance["validation"]["quantized_reference"]["max_abs_diff"] < 1e-3
    engine = specrt.load(str(out), device="cpu", drafter="ngram", batch_invariant=True)
    params = SamplingParams(max_new_tokens=32, stop_token_ids=())
    for prompt in PROMPTS[:2]:
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids


def _rewrite(src, change):
    tensors = load_file(str(src / "model.safetensors"))
    save_file(change(tensors), str(src / "model.safetensors"))



@pytest.mark.parametrize("edit, message", [
    (lambda s: _rewrite(s, lambda t: {k: v for k, v in t.items()
                                      if k != "model.layers.1.mlp.experts.down_proj_scales"}),
     "model.layers.1.mlp.experts.down_proj_blocks has no model.layers.1.mlp.experts.down_proj_scales beside it"),
    (lambda s: _rewrite(s, lambda t: {**t, "model.layers.0.mlp.experts.gate_up_proj_blocks": np.ascontiguousarray(
        t["model.layers.0.mlp.experts.gate_up_proj_blocks"][..., :15])}),
     r"tensor model.layers.0.mlp.experts.gate_up_proj_blocks has shape \(8, 128, 2, 15\)"),
    (lambda s: edit_config(s, num_local_experts=6),
     "layer 0 has tensor model.layers.0.mlp.experts.6.gate_proj.weight, but the config says num_experts = 6"),
    (lambda s: edit_config(s, num_local_experts=10),
     r"tensor model.layers.0.mlp.gate.weight has shape \(8, 64\), expected \(10, 64\)"),
    (lambda s: edit_config(s, num_experts_per_tok=12), "num_experts_per_tok = 12 must be between 1 and num_experts"),
    (lambda s: _rewrite(s, lambda t: {k: v for k, v in t.items() if k != "model.layers.2.self_attn.sinks"}),
     "missing tensor model.layers.2.self_attn.sinks"),
])
def test_bad_gpt_oss_sources_are_named(sources, tmp_path, capsys, edit, message):
    src = tmp_path / "src"
    shutil.copytree(sources["mxfp4"], src)
    edit(src)
    out = tmp_path / "out"
    assert_refused_in_one_line(["convert", str(src), "-o", str(out)], out, capsys, message)


@pytest.mark.parametrize("experts", ["f32", "mxfp4"])
def test_gguf_in_llama_cpps_gpt_oss_layout_reads_as_the_checkpoint(tmp_path, experts):
    """llama.cpp's gpt-oss layout (gate and up split into ffn_{gate,up}_exps with their biases, the router as
    ffn_gate_inp, attn_sinks, post_attention_norm, yarn and the sliding window in the metadata, even layers sliding):
    every tensor read back per expert as the HF checkpoint's own (MXFP4 experts as gguf dequantizes them), the
    config as transformers', and the F32 file converts (its tokenizer from the GGUF's tokenizer keys: transformers
    5.25's whole-file reader fails on gpt-oss's rope.scaling keys) to a bundle that decodes as transformers does."""
    import gguf

    from specrt.models.config import config_from_hf
    from specrt.models.gguf_loader import load_gguf
    from specrt.models.hf_loader import load_hf_folder
    from tests.gguf_writer import write_gpt_oss_gguf
    from tests.tiny_models import WORDS

    model = hf_model("gpt_oss")
    src = tmp_path / "hf"
    model.save_pretrained(src)
    weights = load_file(str(src / "model.safetensors"))
    qtype = gguf.GGMLQuantizationType.MXFP4 if experts == "mxfp4" else None
    write_gpt_oss_gguf(tmp_path / "m.gguf", model.config.to_dict(), weights, ["<|endoftext|>"] + list(WORDS[1:97]),
                       eos=4, experts_as=qtype)
    hf, loaded, _ = load_gguf(tmp_path / "m.gguf")
    hf_src, reference = load_hf_folder(src)  # the HF folder read through the same per-expert view
    ours, theirs = config_from_hf(hf), config_from_hf(hf_src)
    for field in ("num_experts", "experts_per_token", "moe_intermediate_size", "sliding_layers", "sliding_window",
                  "rope", "attention_sinks", "o_bias", "qkv_bias", "moe_bias", "swiglu_limit", "swiglu_alpha"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert set(reference) == set(loaded)
    for name in reference:
        want = reference[name]
        if qtype is not None and ".experts." in name and name.endswith("_proj.weight"):
            want = gguf.quants.dequantize(gguf.quants.quantize(want, qtype), qtype)
        np.testing.assert_allclose(loaded[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
    if qtype is not None:
        return
    import specrt

    out = tmp_path / "bundle"
    assert main(["convert", str(tmp_path / "m.gguf"), "-o", str(out), "--max-context", "128"]) == 0
    engine = specrt.load(str(out), device="cpu")
    assert [engine.tokenizer.tok.id_to_token(i) for i in (0, 5, 71)] == ["<|endoftext|>", "the", "world"]
    assert_ids_decode_as_transformers(engine, model)
