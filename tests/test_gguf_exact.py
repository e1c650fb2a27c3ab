"""--precision gguf: a GGUF's own quantized blocks carried into MatMulNBits exactly (convert/gguf_exact.py), held to
gguf-py's dequantization (which matches ggml's C code) bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.convert.gguf_exact import FORMS, exact_weight
from specrt.kernels import ggml_ops
from tests.gguf_writer import write_gguf
from tests.tiny_models import WORDS

# where each format keeps its fp16 d (and dmin): random bytes there would often be inf or nan
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
               "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,)}


def random_blocks(qtype: str, rows: int, cols: int, rng) -> np.ndarray:
    """[rows, cols / block * type_size] bytes of random blocks of a format, with small finite fp16 fields."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    count = rows * cols // block
    raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        values = (rng.random(count) * 0.02 + 0.001).astype(np.float16)
        raw[:, at:at + 2] = values.view(np.uint8).reshape(count, 2)
    return raw.reshape(rows, -1)


def gguf_dequantized(raw: np.ndarray, qtype: str, shape) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(shape)


def test_every_format_has_its_row():
    import gguf

    for qtype, form in FORMS.items():
        assert (form.type_block, form.type_size) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]


@pytest.mark.parametrize("qtype", list(FORMS))
def test_every_format_is_carried_bit_for_bit(qtype):
    from specrt.convert.quantize import dequantize

    rng = np.random.default_rng(len(qtype))
    raw = random_blocks(qtype, 8, 512, rng)
    qw = exact_weight(qtype, raw.tobytes(), (8, 512))
    assert (qw.bits, qw.block_size, qw.mins is not None) == (FORMS[qtype].bits, FORMS[qtype].block,
                                                              FORMS[qtype].has_min)
    assert np.array_equal(dequantize(qw), gguf_dequantized(raw, qtype, (8, 512)))


@pytest.mark.parametrize("qtype", list(FORMS))
def test_matmul_with_the_minimums_correction_equals_the_exact_weights(qtype):
    """MatMulNBits over the exact blocks, minus block sums times the minimums where the format has them: x @ W^T of
    the dequantized weights to float rounding (float activations)."""
    import onnxruntime as ort
    from onnx import TensorProto

    from specrt.convert.target_graph import GraphOptions, _TargetBuilder
    from specrt.models.config import config_from_hf
    from tests.tiny_models import hf_config

    rng = np.random.default_rng(7)
    n, k = 48, 512
    raw = random_blocks(qtype, n, k, rng)
    w = gguf_dequantized(raw, qtype, (n, k)).astype(np.float64)
    builder = _TargetBuilder(config_from_hf(hf_config("llama").to_dict()), {},
                             GraphOptions(precision="gguf", int4_accuracy_level=0), None)
    builder.g.add_input("x", TensorProto.FLOAT, [1, "s", k])
    y = builder.matmul_nbits("x", ["w"], [exact_weight(qtype, raw.tobytes(), (n, k))], "w", None)
    builder.g.op("Identity", [y], outputs=["y"])
    builder.g.add_output("y", TensorProto.FLOAT, [1, "s", n])
    session = ort.InferenceSession(builder.g.model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 3, k)).astype(np.float32)
    out = session.run(None, {"x": x})[0]
    want = x.astype(np.float64) @ w.T
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()


# a two-layer llama whose tensors use every format: layer 0 mixes formats within q/k/v (one matmul each) and takes
# the minimums' correction in most projections; layer 1 shares one format over q/k/v (one fused matmul)
TYPES = {
    "model.embed_tokens.weight": "Q4_1", "lm_head.weight": "Q5_1",
    "model.layers.0.self_attn.q_proj.weight": "Q4_K", "model.layers.0.self_attn.k_proj.weight": "Q6_K",
    "model.layers.0.self_attn.v_proj.weight": "Q8_0", "model.layers.0.self_attn.o_proj.weight": "Q5_0",
    "model.layers.0.mlp.gate_proj.weight": "Q2_K", "model.layers.0.mlp.up_proj.weight": "Q5_K",
    "model.layers.0.mlp.down_proj.weight": "Q3_K",
    "model.layers.1.self_attn.q_proj.weight": "Q4_0", "model.layers.1.self_attn.k_proj.weight": "Q4_0",
    "model.layers.1.self_attn.v_proj.weight": "Q4_0", "model.layers.1.self_attn.o_proj.weight": "Q6_K",
    "model.layers.1.mlp.gate_proj.weight": "Q4_K", "model.layers.1.mlp.up_proj.weight": "Q4_K",
    "model.layers.1.mlp.down_proj.weight": "IQ4_NL",  # no exact form: quantized to 8 bits, and said so
}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    """(path, config, {HF name: the dequantized weights in HF's row order})."""
    import gguf
    import transformers as tf

    from specrt.models.gguf_loader import unpermute as _unpermute

    config = tf.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
                            max_position_embeddings=256, rms_norm_eps=1e-6)
    hf = tf.LlamaForCausalLM(config).eval()
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    rng = np.random.default_rng(3)
    expected = {}

    def encode(name, w):
        t = TYPES.get(name)
        if t is None:
            return w, None
        qtype = gguf.GGMLQuantizationType[t]
        data = random_blocks(t, *w.shape, rng)
        want = gguf.quants.dequantize(data, qtype).reshape(w.shape)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            want = _unpermute(want, 4 if "q_proj" in name else 2)
        expected[name] = want
        return data, qtype

    path = tmp_path_factory.mktemp("gguf_exact") / "mixed.gguf"
    write_gguf(path, "llama", config, weights, encode, tokens=["<|endoftext|>"] + list(WORDS[1:97]), bpe=True)
    return path, config, expected


@pytest.mark.parametrize("ggml_operators", [False, True], ids=["matmulnbits", "ggml-operators"])
def test_a_mixed_format_gguf_is_written_exactly(mixed_gguf, tmp_path, ggml_operators):
    """The weights the graph holds, read back from its data file, are the GGUF's dequantization bit for bit (the
    q/k row permutation of llama.cpp's converter undone on the blocks); the one IQ4_NL tensor is named as
    quantized again. With specrt's operators, the Q4_K, Q5_K and Q6_K matrices are the file's own blocks (their
    rows moved by the q/k permutation) under MatMulQ4_K / MatMulQ5_K / MatMulQ6_K, and so are Q5_0 and Q5_1."""
    import onnx

    from specrt.convert.quantize import dequantize
    from specrt.convert.target_graph import GraphOptions, write_target_graph
    from specrt.models.config import config_from_hf
    from specrt.models.gguf_loader import load_gguf

    path, _, expected = mixed_gguf
    hf, weights, _ = load_gguf(path)
    cfg = config_from_hf(hf)
    opts = GraphOptions(precision="gguf", attention_rows_input=True, ggml_operators=ggml_operators)
    written = write_target_graph(cfg, weights, opts, tmp_path, "t")
    ops = sorted(n.op_type for n in onnx.load(str(tmp_path / "t.onnx"), load_external_data=False).graph.node
                 if n.domain == "specrt.ggml")
    # layer 0: q (Q4_K), k (Q6_K), o (Q5_0), up (Q5_K); layer 1: o (Q6_K), fused gate|up (Q4_K); lm_head (Q5_1).
    # The rest are types the operators do not take (Q4_0, Q8_0, Q2_K, Q3_K, IQ4_NL).
    want = ["MatMulQ4_K", "MatMulQ4_K", "MatMulQ5_0", "MatMulQ5_1", "MatMulQ5_K", "MatMulQ6_K", "MatMulQ6_K"]
    assert ops == (want if ggml_operators else [])
    assert written.gguf_requantized == {"model.layers.1.mlp.down_proj.weight": "IQ4_NL"}
    for name, want in expected.items():
        if name in written.gguf_requantized:
            continue
        assert np.array_equal(dequantize(written.quantized(name)), want), name


def test_a_gguf_bundle_validates_and_speculates_exactly(mixed_gguf, tmp_path, capsys):
    import json

    import specrt
    from specrt.cli import main
    from specrt.runtime.sampling import SamplingParams

    path, _, _ = mixed_gguf
    out = tmp_path / "bundle"
    assert main(["convert", str(path), "-o", str(out), "--precision", "gguf", "--max-context", "128"]) == 0
    log = capsys.readouterr()
    assert "gguf: 15 weights in the file's own quantization, exactly" in log.out + log.err
    manifest = json.loads((out / "specrt.json").read_text())
    assert manifest["target"]["precision"] == "gguf"
    validation = manifest["provenance"]["validation"]
    assert validation["quantized_reference"]["top1_agreement"] == 1.0  # the graph == torch on the same weights
    assert validation["gguf_requantized"] == {"IQ4_NL": 1}  # the one weight with no exact form, by type
    engine = specrt.load(str(out), device="cpu", drafter="ngram", batch_invariant=True)
    params = SamplingParams(max_new_tokens=24, stop_token_ids=())
    for prompt in ("the cat and the dog and the cat and the dog", "a man in the house of the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids


def test_a_short_block_is_named():
    from specrt.errors import SourceError

    raw = random_blocks("Q4_K", 2, 256, np.random.default_rng(0)).tobytes()
    with pytest.raises(SourceError, match="tensor blk.0.attn_q.weight: 287 bytes where 2 rows of Q4_K need 288"):
        exact_weight("Q4_K", raw[:-1], (2, 256), "blk.0.attn_q.weight")
    with pytest.raises(SourceError, match="rows of 100 weights are not whole Q4_K blocks of 256"):
        exact_weight("Q4_K", raw, (2, 100), "w")


def test_gguf_precision_needs_a_gguf_source(tmp_path, capsys):
    from tests.tiny_models import assert_refused_in_one_line, save_tiny_bundle_source

    source = save_tiny_bundle_source("llama", tmp_path / "hf")
    assert_refused_in_one_line(["convert", str(source), "-o", str(tmp_path / "out"), "--precision", "gguf"],
                               tmp_path / "out", capsys, "--precision gguf keeps a GGUF file's own quantized weights")


def test_convert_keeps_a_quantized_ggufs_weights_by_default(mixed_gguf, tmp_path):
    """No --precision: a quantized GGUF converts as gguf (its own weights), a float GGUF and an HF folder as fp32."""
    from specrt.convert.sources import default_precision
    from tests.tiny_models import save_tiny_bundle_source

    path, config, _ = mixed_gguf
    assert default_precision(str(path)) == "gguf"
    assert default_precision("smollm2-135m-instruct") == "gguf"  # a catalog model: a Q4_1 GGUF
    floats = tmp_path / "f32.gguf"
    import transformers as tf

    weights = {k: v.detach().numpy() for k, v in tf.LlamaForCausalLM(config).state_dict().items()}
    write_gguf(floats, "llama", config, weights, lambda name, w: (w, None))
    assert default_precision(str(floats)) == "fp32"
    assert default_precision(str(save_tiny_bundle_source("llama", tmp_path / "hf"))) == "fp32"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_0"])  # MatMulNBits' exact form; specrt's operators
def test_a_quantized_qwen35_gguf_keeps_its_blocks_through_llama_cpps_reordering(tmp_path, qtype):
    """llama.cpp's qwen35 layout reorders value heads (rows of attn_qkv and attn_gate, columns of ssm_out): the
    blocks follow (in the operators, ssm_out's activations are gathered into the file's column order instead), so
    the graph's weights are the file's dequantized weights in HF's order, bit for bit; the bundle validates and
    speculates with its MTP module exactly as plain decoding."""
    import gguf

    import specrt
    from specrt.cli import main
    from specrt.convert.quantize import dequantize
    from specrt.convert.target_graph import GraphOptions, write_target_graph
    from specrt.models.config import config_from_hf
    from specrt.models.gguf_loader import load_gguf
    from specrt.runtime.sampling import SamplingParams
    from tests.gguf_writer import write_qwen35_gguf
    from tests.test_qwen3_5 import random_mtp_tensors
    from tests.tiny_models import hf_model

    model = hf_model("qwen3_5_text_heads32")  # heads of whole blocks, as the published 128 columns are
    hf = model.config.to_dict()
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    weights.update(random_mtp_tensors("qwen3_next", config_from_hf(hf), 1))

    kind = getattr(gguf.GGMLQuantizationType, qtype)

    def encode(name, data):  # every matrix whose rows are whole blocks of 32: that type
        if data.ndim == 2 and data.shape[1] % 32 == 0:
            return gguf.quants.quantize(data, kind), kind
        return data, None

    path = tmp_path / "q.gguf"
    write_qwen35_gguf(path, hf, weights, ["<|endoftext|>"] + list(WORDS[1:97]), eos=4, mtp_layers=1, encode=encode)
    got, loaded, _ = load_gguf(path)
    operators = qtype == "Q5_0"
    written = write_target_graph(config_from_hf(got), loaded, GraphOptions(
        precision="gguf", attention_rows_input=True, ggml_operators=operators), tmp_path, "t")
    reordered = [n for n in written.quant_rows if "in_proj_qkv" in n or "out_proj" in n]
    assert reordered and not written.gguf_requantized
    gathered = [n for n in written.quant_rows if written.quant_rows[n].columns]
    assert (gathered and all("linear_attn.out_proj" in n for n in gathered)) if operators else not gathered
    for name in written.quant_rows:
        assert np.array_equal(dequantize(written.quantized(name)), loaded[name]), name
    out = tmp_path / "bundle"
    assert main(["convert", str(path), "-o", str(out), "--max-context", "128", "--drafter", "mtp"]) == 0
    engine = specrt.load(str(out), device="cpu", drafter="mtp", batch_invariant=True)
    assert engine.manifest.target.precision == "gguf"
    engine.adaptive = False
    params = SamplingParams(max_new_tokens=24, stop_token_ids=())
    plain = engine.generate("the cat and the dog", params, drafter=None).wait()
    spec = engine.generate("the cat and the dog", params).wait()
    assert spec.token_ids == plain.token_ids and sum(spec.stats.drafted_by_position) > 0


@pytest.mark.parametrize("damage, message", [
    ("type", r"tensor blk\.0\.attn_q\.weight has an unknown GGML type 99"),
    ("rows", r"tensor blk\.0\.attn_q\.weight \(Q4_K\) has rows of 200 weights, not whole Q4_K blocks of 256"),
    ("truncated", r"tensor output\.weight \(Q5_1\) runs past the end of the file"),
])
def test_a_damaged_quantized_tensor_is_named_with_its_type(mixed_gguf, tmp_path, capsys, damage, message):
    import struct

    from tests.tiny_models import assert_refused_in_one_line

    data = bytearray(mixed_gguf[0].read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(name) + len(name)  # then: dimensions (u32), each dimension (u64), type (u32), offset (u64)
    dims = struct.unpack_from("<I", data, at)[0]
    if damage == "type":
        struct.pack_into("<I", data, at + 4 + 8 * dims, 99)
    elif damage == "rows":
        struct.pack_into("<Q", data, at + 4, 200)
    else:
        del data[-4000:]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert_refused_in_one_line(["convert", str(bad), "-o", str(out), "--precision", "gguf"], out, capsys, message)


@pytest.mark.parametrize("moves", ["rows", "columns", "both"])
def test_the_files_blocks_follow_a_reordering_of_rows_or_of_columns(moves):
    """A loader's reordering applied to the exact form: whole rows move with their blocks (the operators keep the
    file's bytes); columns of 128 (Qwen3.5's ssm_out value heads) split Q4_K's blocks of 256, so the blocks stay as
    the file has them and the product gathers its activations into the file's column order instead (ggml_columns:
    HF column c is the blocks' column ggml_columns[c]); a reordering of both keeps only the MatMulNBits form, which
    carries the reordered values exactly either way."""
    from specrt.convert.gguf_exact import reorder_exact
    from specrt.convert.quantize import dequantize

    rng = np.random.default_rng(7)
    raw = random_blocks("Q4_K", 16, 512, rng)
    qw = exact_weight("Q4_K", raw.tobytes(), (16, 512))
    assert qw.ggml_blocks is not None
    rows, cols = rng.permutation(16), np.concatenate([np.arange(128, 256), np.arange(128), np.arange(256, 512)])
    reorder = {"rows": lambda a: a[rows], "columns": lambda a: a[:, cols], "both": lambda a: a[rows][:, cols]}[moves]
    moved = reorder_exact(qw, reorder)
    want = reorder(gguf_dequantized(raw, "Q4_K", (16, 512)))
    assert np.array_equal(dequantize(moved), want)
    if moves == "rows":
        assert np.array_equal(gguf_dequantized(moved.ggml_blocks, "Q4_K", (16, 512)), want)
        assert moved.ggml_columns is None
    elif moves == "columns":
        assert np.array_equal(moved.ggml_blocks, raw.reshape(16, -1)) and np.array_equal(moved.ggml_columns, cols)
        x = rng.standard_normal(512)  # the product of the file's blocks with x gathered equals the moved weights'
        file_w = gguf_dequantized(moved.ggml_blocks, "Q4_K", (16, 512)).astype(np.float64)
        np.testing.assert_allclose(file_w @ x[np.argsort(moved.ggml_columns)], want.astype(np.float64) @ x,
                                   rtol=1e-9, atol=1e-9)
    else:
        assert moved.ggml_blocks is None


def test_conversion_refuses_graph_weights_that_are_not_the_files(tmp_path):
    """check_file_weights: the torch model on the graph's weights read back against the loader's reading of the
    file; logits apart beyond the fp32 limit stop the conversion (the exact check alone follows the graph)."""
    from specrt.convert.validate import SpilledOutputs, check_file_weights
    from specrt.errors import ValidationError

    rng = np.random.default_rng(0)
    logits = [rng.standard_normal((5, 32)).astype(np.float32) for _ in range(2)]
    source = SpilledOutputs(tmp_path / "s", "source", [(x, None) for x in logits])
    same = SpilledOutputs(tmp_path / "q", "same", [(x + 1e-6, None) for x in logits])
    assert check_file_weights(source, same) == pytest.approx(1e-6, rel=0.5)
    off = SpilledOutputs(tmp_path / "o", "off", [(logits[0], None), (logits[1][:, ::-1].copy(), None)])
    with pytest.raises(ValidationError, match="the graph's weights differ from the file's"):
        check_file_weights(source, off)


@pytest.mark.skipif(not ggml_ops.enabled(), reason="no C compiler here: specrt's GGUF operators")
def test_a_tied_k_quant_table_is_looked_up_and_multiplied_from_one_copy(tmp_path, capsys):
    """A tied model whose token_embd is Q6_K (llama.cpp's Q4_K_M for Gemma 4, Llama 3.2, Qwen3's small sizes): the
    embedding gathers rows from the file's blocks (GatherQ6_K) and the lm_head multiplies by the same initializer
    (MatMulQ6_K: 6.6 bits a weight against 10.5 in MatMulNBits' form); both read back as gguf-py's dequantization; the
    bundle validates against torch on those weights and speculates exactly."""
    import json

    import gguf
    import onnx
    import transformers as tf

    import specrt
    from specrt.cli import main
    from specrt.convert.quantize import dequantize
    from specrt.convert.target_graph import GraphOptions, write_target_graph
    from specrt.models.config import config_from_hf
    from specrt.models.gguf_loader import load_gguf
    from specrt.runtime.sampling import SamplingParams

    config = tf.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                            max_position_embeddings=256, rms_norm_eps=1e-6)
    hf = tf.LlamaForCausalLM(config).eval()
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    rng = np.random.default_rng(4)
    table = {}

    def encode(name, w):
        if w.ndim != 2:
            return w, None
        qtype = "Q6_K" if name == "model.embed_tokens.weight" else "Q4_K"
        data = random_blocks(qtype, *w.shape, rng)
        if qtype == "Q6_K":
            table["want"] = gguf_dequantized(data, qtype, w.shape)
        return data, gguf.GGMLQuantizationType[qtype]

    path = tmp_path / "tied.gguf"
    write_gguf(path, "llama", config, weights, encode, tokens=["<|endoftext|>"] + list(WORDS[1:97]), bpe=True)
    out = tmp_path / "bundle"
    assert main(["convert", str(path), "-o", str(out), "--precision", "gguf", "--max-context", "128"]) == 0
    capsys.readouterr()
    graph = onnx.load(str(out / "target.onnx"), load_external_data=False).graph
    gather = [n for n in graph.node if n.op_type == "GatherQ6_K"]
    head = [n for n in graph.node if n.name == "lm_head"]
    assert len(gather) == 1 and head[0].op_type == "MatMulQ6_K" and head[0].input[1] == gather[0].input[1]
    assert not [n for n in graph.node if n.op_type in ("GatherBlockQuantized", "MatMulNBits")]
    validation = json.loads((out / "specrt.json").read_text())["provenance"]["validation"]
    assert validation["quantized_reference"]["top1_agreement"] == 1.0
    hf_cfg, loaded, _ = load_gguf(path)
    written = write_target_graph(config_from_hf(hf_cfg), loaded,
                                 GraphOptions(precision="gguf", attention_rows_input=True, ggml_operators=True),
                                 tmp_path, "t")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert np.array_equal(dequantize(written.quantized(name)), table["want"]), name
    engine = specrt.load(str(out), device="cpu", drafter="ngram", batch_invariant=True)
    params = SamplingParams(max_new_tokens=24, stop_token_ids=())
    for prompt in ("the cat and the dog and the cat and the dog", "a man in the house of the world"):
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids
