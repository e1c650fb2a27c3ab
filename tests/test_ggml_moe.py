"""specrt's MoE operator (specrt/kernels/ggml_ops/ggml_moe.c): a mixture-of-experts MLP over experts kept in the
GGUF file's own blocks, held to numpy with gguf-py's dequantization of the same blocks; a token's output is the
same bits in any call; bad ids and misshaped experts are clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.kernels import ggml_ops
from specrt.kernels.ggml_ops import layout
from tests.test_gguf_exact import gguf_dequantized, random_blocks

pytestmark = pytest.mark.skipif(not ggml_ops.enabled(), reason="no C compiler here: specrt's GGUF operators")

TYPE_NUMBER = ggml_ops.TYPE_NUMBERS
E, H, I, K = 6, 512, 256, 2  # experts, hidden, each expert's intermediate rows, experts a token


def _experts(qtype: str, rows: int, cols: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """E random matrices [rows, cols] of the type: (interleaved and stacked as conversion writes them, their
    dequantized weights [E, rows, cols] float64)."""
    blocks = [np.ascontiguousarray(random_blocks(qtype, rows, cols, rng)) for _ in range(E)]
    if qtype == "Q5_1":  # a minimum that centres the block, as real weights have
        for b in blocks:
            view = b.reshape(-1, 24)
            d = view[:, 0:2].copy().view(np.float16).astype(np.float32)
            view[:, 2:4] = (-d * 31 / 2).astype(np.float16).view(np.uint8)
    packed = np.concatenate([layout.interleave(qtype, b) for b in blocks])
    return packed, np.stack([gguf_dequantized(b, qtype, (rows, cols)).astype(np.float64) for b in blocks])


def _case(gate="Q4_K", up="Q4_K", down="Q6_K", tokens=5, seed=0):
    rng = np.random.default_rng(seed)
    weights = {"gate": _experts(gate, I, H, rng), "up": _experts(up, I, H, rng), "down": _experts(down, H, I, rng)}
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(tokens)]).astype(np.int64)
    routing = rng.random((tokens, K)).astype(np.float32)
    return x, ids, routing, weights


def _reference(x, ids, routing, weights, activation: str) -> np.ndarray:
    (_, gate), (_, up), (_, down) = weights["gate"], weights["up"], weights["down"]
    y = np.zeros(x.shape, np.float64)
    for t in range(len(x)):
        for j, e in enumerate(ids[t]):
            g, u = gate[e] @ x[t], up[e] @ x[t]
            if activation == "silu":
                a = g * 0.5 * (1 + np.tanh(g / 2))  # g * sigmoid(g)
            else:
                a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
            y[t] += routing[t, j] * (down[e] @ (a * u))
    return y


def _session(types=("Q4_K", "Q4_K", "Q6_K"), weights=None, threads=0, level=4, activation=0, experts=E, inter=I,
             fused=0):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("MoE", ["X", "ids", "w", "gate", "up", "down"], ["Y"], domain=ggml_ops.DOMAIN,
                            experts=experts, inter=inter, gate_type=TYPE_NUMBER[types[0]],
                            up_type=TYPE_NUMBER[types[1]], down_type=TYPE_NUMBER[types[2]], activation=activation,
                            accuracy_level=level, fused_gate_up=fused)
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, "S", H]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, ["S", K]),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, ["S", K])]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights[n][0], n) for n in ("gate", "up", "down")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ggml_ops.DOMAIN, 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    ggml_ops.register(opts)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("types,activation", [(("Q4_K", "Q4_K", "Q6_K"), "silu"), (("Q5_K", "Q5_0", "Q5_1"), "silu"),
                                              (("Q6_K", "Q4_K", "Q4_K"), "gelu_tanh")])
def test_float_activations_give_the_experts_of_the_files_weights(types, activation):
    """accuracy_level 0 (conversion's exact check): the weighted sum of each token's experts with the file's
    weights, as numpy computes it from gguf-py's dequantization."""
    x, ids, routing, weights = _case(*types)
    got = _session(types, weights, level=0, activation=int(activation == "gelu_tanh")).run(
        None, {"X": x[None], "ids": ids, "w": routing})[0][0]
    want = _reference(x, ids, routing, weights, activation)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_a_token_is_the_same_in_any_call():
    """8-bit activations (the decoding path): each token of a 7-token call, whose tokens share experts, equals that
    token called alone bit for bit, with two threads or one; and the whole is the experts' sum within the
    activations' rounding."""
    x, ids, routing, weights = _case(tokens=7, seed=1)
    ids[3] = ids[0]  # two tokens on the same experts: one expert's rows several at once
    two, one = _session(weights=weights, threads=2), _session(weights=weights, threads=1)
    whole = two.run(None, {"X": x[None], "ids": ids, "w": routing})[0][0]
    for t in range(len(x)):
        alone = one.run(None, {"X": x[None, t:t + 1], "ids": ids[t:t + 1], "w": routing[t:t + 1]})[0][0, 0]
        assert np.array_equal(alone, whole[t]), t
    want = _reference(x, ids, routing, weights, "silu")
    assert np.abs(whole - want).max() <= 2e-2 * np.abs(want).max()
    assert np.abs(whole - want).max() > 0  # the 8-bit path was taken


def test_a_fused_gate_up_reads_each_experts_gate_rows_then_its_up_rows():
    """fused_gate_up (Gemma 4's gate_up_proj): one tensor of each expert's gate rows then its up rows gives what
    the two tensors apart give, bit for bit."""
    x, ids, routing, weights = _case(seed=2)
    interleaved_gate, interleaved_up = weights["gate"][0], weights["up"][0]
    groups = I // 8
    fused = np.concatenate([np.concatenate([interleaved_gate[e * groups:(e + 1) * groups],
                                            interleaved_up[e * groups:(e + 1) * groups]]) for e in range(E)])
    apart = _session(weights=weights).run(None, {"X": x[None], "ids": ids, "w": routing})[0]
    joined = _session(weights={**weights, "gate": (fused, None), "up": (fused, None)}, fused=1).run(
        None, {"X": x[None], "ids": ids, "w": routing})[0]
    assert np.array_equal(apart, joined)


def test_an_expert_id_outside_the_layer_is_a_clear_error():
    x, ids, routing, weights = _case()
    ids[2, 1] = E
    with pytest.raises(Exception, match=r"an expert id is outside \[0, experts\)"):
        _session(weights=weights).run(None, {"X": x[None], "ids": ids, "w": routing})


def test_experts_of_another_shape_are_a_clear_error():
    x, ids, routing, weights = _case()
    with pytest.raises(Exception, match="are not E experts' interleaved blocks"):
        _session(weights=weights, experts=E + 1).run(None, {"X": x[None], "ids": ids, "w": routing})
    with pytest.raises(Exception, match="MoE needs experts, inter"):
        _session(weights=weights, activation=5)


def _q5_experts(gguf_name: str, w: np.ndarray):
    """gguf-py's Q5_0 for the gate and up experts, Q5_1 for down (types of 32-weight blocks: the tiny model's widths),
    float for the rest."""
    import gguf

    if not gguf_name.endswith("_exps.weight"):
        return w, None
    qtype = gguf.GGMLQuantizationType.Q5_1 if "_down_" in gguf_name else gguf.GGMLQuantizationType.Q5_0
    return gguf.quants.quantize(w, qtype), qtype


def _write_moe_gguf(arch: str, folder, path) -> None:
    """The tiny model `arch` as llama.cpp's converter lays it out, its experts Q5_0 / Q5_1 (_q5_experts)."""
    from safetensors.numpy import load_file

    from tests.gguf_writer import write_gemma4_gguf, write_qwen3moe_gguf
    from tests.tiny_models import WORDS, hf_model

    model = hf_model(arch)
    tokens = ["<|endoftext|>"] + list(WORDS[1:97])
    if arch == "gemma4_moe":
        from specrt.models.gemma4 import expert_view

        weights = expert_view({k: v.detach().numpy() for k, v in model.state_dict().items()})
        write_gemma4_gguf(path, model.config.to_dict(), weights, tokens, eos=4, encode=_q5_experts)
        return
    model.save_pretrained(folder)
    weights = load_file(str(folder / "model.safetensors"))
    write_qwen3moe_gguf(path, model.config.to_dict(), weights, tokens, eos=4, encode=_q5_experts)


@pytest.mark.parametrize("arch", ["qwen3_moe", "gemma4_moe"])  # SwiGLU experts; gated GELU with gate_up fused
def test_a_gguf_moe_keeps_its_experts_blocks_and_speculates_losslessly(tmp_path, arch):
    """A GGUF whose experts are quantized: conversion keeps their blocks in the MoE operator (no QMoE, no If per
    expert, no expert requantized, no Scan over tokens nor its switch), its own exact check (the graph with float
    activations against torch with the file's weights) passed, and batch-invariant speculation equals plain
    decoding token for token."""
    import json

    import onnx

    import specrt
    from specrt.app.bench_replay import ReplayDrafter
    from specrt.bundle import EXPERT_CALLS_INPUT
    from specrt.cli import main
    from specrt.runtime.sampling import SamplingParams

    _write_moe_gguf(arch, tmp_path / "hf", tmp_path / "m.gguf")
    out = tmp_path / "bundle"
    assert main(["convert", str(tmp_path / "m.gguf"), "-o", str(out), "--precision", "gguf",
                 "--max-context", "128"]) == 0
    graph = onnx.load(str(out / "target.onnx"), load_external_data=False).graph
    kinds = {(n.domain, n.op_type) for n in graph.node}
    assert (ggml_ops.DOMAIN, "MoE") in kinds and not any(t in ("QMoE", "Scan", "If") for _, t in kinds)
    assert EXPERT_CALLS_INPUT not in {i.name for i in graph.input}
    manifest = json.loads((out / "specrt.json").read_text())
    assert EXPERT_CALLS_INPUT not in manifest["target"]["inputs"]
    validation = manifest["provenance"]["validation"]
    assert set(validation["gguf_requantized"]) <= {"F32", "F16"}  # only the float tensors were
    assert validation["quantized_reference"]["max_abs_diff"] < 1e-5  # the file's weights, float activations
    engine = specrt.load(str(out), device="cpu", batch_invariant=True)
    params = SamplingParams(max_new_tokens=48, stop_token_ids=())
    engine.max_draft, engine.adaptive = 4, False
    for prompt in ("the cat and the dog and the cat and the dog", "a man in the house of the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        # plain's own tokens, each right with probability 0.7: multi-token calls, some rejected
        replay = ReplayDrafter(plain.stats.prompt_tokens, plain.token_ids, engine.manifest.vocab_size, acceptance=0.7)
        spec = engine.generate(prompt, params, drafter=replay).wait()
        assert spec.token_ids == plain.token_ids
        assert spec.stats.target_calls < plain.stats.target_calls  # drafts were verified in multi-token calls
