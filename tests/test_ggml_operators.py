"""specrt's GGUF operators (specrt/kernels/ggml_ops: MatMulQ4_K, MatMulQ5_K, MatMulQ6_K, MatMulQ5_0, MatMulQ5_1 over
the file's own blocks, and their Gather twins), held to gguf-py's dequantization (float activations; the gathered
rows bit for bit) and to a numpy model of their 8-bit activation scheme; a row's result does not depend on the call;
the plain C and AVX-512 paths equal the AVX2 path; the
interleaved layout is the same in C and numpy; a bundle that needs them says so when they are missing."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from specrt.kernels import ggml_ops
from specrt.kernels.ggml_ops import layout
from tests.test_gguf_exact import gguf_dequantized, random_blocks

pytestmark = pytest.mark.skipif(not ggml_ops.enabled(), reason="no C compiler here: specrt's GGUF operators")

TYPE_NUMBER = ggml_ops.TYPE_NUMBERS
TYPES = list(TYPE_NUMBER)
P = ctypes.c_void_p


def _product(lib, qtype: str, x: np.ndarray, blocks: np.ndarray, n: int, float_activations: bool) -> np.ndarray:
    """x @ W^T through the library, W given as the file's blocks [n, row bytes] (interleaved here, as conversion
    writes them)."""
    x = np.ascontiguousarray(x, np.float32)
    y = np.zeros((x.shape[0], n), np.float32)
    packed = layout.interleave(qtype, blocks)
    rc = lib.specrt_ggml_matmul(TYPE_NUMBER[qtype], x.ctypes.data_as(P), ctypes.c_int64(x.shape[0]),
                                ctypes.c_int64(x.shape[1]), packed.ctypes.data_as(P), ctypes.c_int64(n),
                                y.ctypes.data_as(P), int(float_activations))
    assert rc == 0
    return y


def _case(qtype: str, n: int = 37, k: int = 768, m: int = 5, seed: int = 0):
    """Random blocks of the type (a 32-block format: k = 576, which leaves a last group of 2 of 8 blocks), random
    activations with one outlier feature; the formats with a minimum get one that centres the block, as real
    weights have (an all-positive block would measure float cancellation, not the operator)."""
    rng = np.random.default_rng(seed)
    k = k if qtype.endswith("_K") else 576
    blocks = np.ascontiguousarray(random_blocks(qtype, n, k, rng))
    if qtype == "Q5_1":
        view = blocks.reshape(-1, 24)
        d = view[:, 0:2].copy().view(np.float16).astype(np.float32)
        view[:, 2:4] = (-d * 31 / 2).astype(np.float16).view(np.uint8)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, 3] *= 40  # an outlier feature, as real activations have
    return x, blocks, gguf_dequantized(blocks, qtype, (n, k)).astype(np.float64)


def _q8_model(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The 8-bit scheme in numpy: x per 32 values scaled to [-127, 127] and rounded to nearest even (MatMulNBits'
    int8 activations use blocks of 32 too); the product is then with those values, which the operators compute as
    integer dot products rescaled once per 32."""
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32).astype(np.float32)  # (k: a whole number of 32s in every case here)
    amax = np.abs(blocks).max(-1, keepdims=True)
    scale = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.rint(blocks * inv), -127, 127)
    return ((q * scale).reshape(m, k).astype(np.float64)) @ w.T


@pytest.fixture(scope="module")
def lib():
    return ctypes.CDLL(str(ggml_ops.library()))


@pytest.mark.parametrize("qtype", TYPES)
def test_float_activations_give_the_product_with_the_files_weights(lib, qtype):
    x, blocks, w = _case(qtype)
    got = _product(lib, qtype, x, blocks, w.shape[0], float_activations=True)
    want = x.astype(np.float64) @ w.T
    assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()


@pytest.mark.parametrize("qtype", TYPES)
def test_int8_activations_follow_their_scheme(lib, qtype):
    x, blocks, w = _case(qtype, seed=1)
    got = _product(lib, qtype, x, blocks, w.shape[0], float_activations=False)
    model = _q8_model(x, w)
    assert np.abs(got - model).max() <= 2e-6 * np.abs(model).max()
    exact = x.astype(np.float64) @ w.T  # near the exact product: 8-bit activations' error (an outlier in one block)
    assert np.abs(got - exact).max() <= 5e-2 * np.abs(exact).max()


def test_the_plain_c_path_equals_the_vector_path(lib, tmp_path):
    """Built without -march (no AVX2: the loops in plain C, each row's block gathered back to the file's layout),
    the library computes the same integers in the same float order: the same bits with 8-bit activations (float
    activations: the compiler may fuse the float path's multiply-adds differently)."""
    here = Path(ggml_ops.__file__).parent
    plain = tmp_path / "plain.so"
    subprocess.run([ggml_ops._compiler(), "-O2", "-fPIC", "-shared", "-std=c11", "-o", str(plain),
                    str(here / "ggml_kernels.c"), "-lm"], check=True, capture_output=True)
    scalar = ctypes.CDLL(str(plain))
    for qtype in TYPE_NUMBER:
        x, blocks, w = _case(qtype, seed=2)
        for float_activations in (False, True):
            a = _product(lib, qtype, x, blocks, w.shape[0], float_activations)
            b = _product(scalar, qtype, x, blocks, w.shape[0], float_activations)
            if float_activations:
                assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max(), qtype
            else:
                assert np.array_equal(a, b), qtype


def _cpu_has(*flags: str) -> bool:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    have = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return all(f in have for f in flags)


@pytest.mark.skipif(not _cpu_has("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni"),
                    reason="the wide (AVX-512) path and the AVX2 path both run only on an AVX-512 VNNI CPU")
def test_the_wide_path_equals_the_avx2_path_bit_for_bit(lib, tmp_path):
    """The AVX-512 build sums the same integers in fewer steps, then rounds in the same float order: equal bits, so
    a bundle decodes alike on both kinds of x86 CPU."""
    here = Path(ggml_ops.__file__).parent
    narrow = tmp_path / "avx2.so"
    subprocess.run([ggml_ops._compiler(), "-O3", "-mavx2", "-mfma", "-mf16c", "-fno-math-errno", "-fPIC", "-shared",
                    "-std=c11", "-o", str(narrow), str(here / "ggml_kernels.c"), "-lm"], check=True, capture_output=True)
    avx2 = ctypes.CDLL(str(narrow))
    for qtype in TYPE_NUMBER:
        x, blocks, w = _case(qtype, m=11, seed=4)
        wide = _product(lib, qtype, x, blocks, w.shape[0], float_activations=False)
        assert np.array_equal(wide, _product(avx2, qtype, x, blocks, w.shape[0], float_activations=False)), qtype


def _op_session(op: str, first, qtype: str, blocks: np.ndarray, threads: int = 0, **attributes):
    """A session of one operator `op` (inputs: `first`, a value info, and B, the blocks interleaved as conversion
    writes them) with the operators registered."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, [first.name, "B"], ["Y"], domain=ggml_ops.DOMAIN, **attributes)
    graph = helper.make_graph([node], "g", [first], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(layout.interleave(qtype, blocks), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ggml_ops.DOMAIN, 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    ggml_ops.register(opts)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _session(qtype: str, blocks: np.ndarray, k: int, threads: int, level: int = 4, rows: int | None = None):
    from onnx import TensorProto, helper

    return _op_session(ggml_ops.OPS[qtype], helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "S", k]),
                       qtype, blocks, threads, accuracy_level=level, N=len(blocks) if rows is None else rows)


@pytest.mark.parametrize("qtype", TYPES)
def test_a_row_is_the_same_in_any_call(qtype):
    """Through ONNX Runtime: each row of a 9-row call equals that row called alone, bit for bit, with one thread or
    two (the output columns split between threads; each output one fixed sequence of operations)."""
    x, blocks, w = _case(qtype, n=300, m=9, seed=3)
    k = x.shape[1]
    two, one = _session(qtype, blocks, k, threads=2), _session(qtype, blocks, k, threads=1)
    whole = two.run(None, {"A": x[None]})[0]
    assert whole.shape == (1, 9, 300)
    for i in range(9):
        alone = one.run(None, {"A": x[None, i:i + 1]})[0]
        assert np.array_equal(alone[0, 0], whole[0, i]), i
    exact = _session(qtype, blocks, k, threads=2, level=0).run(None, {"A": x[None]})[0][0]
    want = x.astype(np.float64) @ w.T
    assert np.abs(exact - want).max() <= 2e-6 * np.abs(want).max()  # accuracy_level 0: float activations


@pytest.mark.parametrize("qtype", TYPES)
def test_gather_gives_the_files_rows_as_gguf_py_dequantizes_them(qtype):
    """GatherQ*: rows of an embedding table kept in the file's blocks are gguf-py's dequantization of those rows,
    bit for bit (ggml's get_rows computes the same float products), for ids in any group of 8 and the last,
    padded group; a negative id counts from the end, as ONNX's Gather; an id outside the table is a clear error."""
    from onnx import TensorProto, helper

    _, blocks, w = _case(qtype, n=37, seed=5)
    ids_info = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "S"])
    session = _op_session(ggml_ops.GATHERS[qtype], ids_info, qtype, blocks, N=37)
    ids = np.array([[0, 7, 8, 36, 13, 13, -1]], np.int64)
    got = session.run(None, {"ids": ids})[0]
    assert got.shape == (1, 7, w.shape[1])
    assert np.array_equal(got[0], w[ids[0] % 37].astype(np.float32))
    with pytest.raises(Exception, match="a token id is outside the embedding table"):
        session.run(None, {"ids": np.array([[37]], np.int64)})


def test_misshaped_blocks_are_a_clear_error():
    x, blocks, _ = _case("Q4_K")
    session = _session("Q4_K", blocks, x.shape[1], threads=1, rows=len(blocks) + 8)  # one group more than B has
    with pytest.raises(Exception, match="B is not N rows of K / block blocks of its type by 8"):
        session.run(None, {"A": x[None]})


def test_a_graph_from_before_the_interleaving_asks_to_be_converted_again():
    """A bundle written by the specrt before the rows were interleaved has operators without N: opening it says
    what to do instead of multiplying by bytes in the wrong places."""
    import onnxruntime as ort

    _, blocks, _ = _case("Q6_K")
    opts = ort.SessionOptions()
    ggml_ops.register(opts)
    with pytest.raises(Exception, match="converted by an earlier specrt, whose weights are not interleaved"):
        ort.InferenceSession(_session_model_bytes(blocks), opts, providers=["CPUExecutionProvider"])


def test_a_bundle_that_needs_the_operators_says_so_without_them(tmp_path, monkeypatch):
    from specrt.errors import BundleError
    from specrt.runtime.target_session import open_session

    graph = tmp_path / "target.onnx"
    _, blocks, _ = _case("Q6_K")
    graph.write_bytes(_session_model_bytes(blocks))

    def missing():
        raise ggml_ops.NativeUnavailable("no C compiler (cc, gcc or clang) to build specrt's GGUF operators")

    monkeypatch.setattr(ggml_ops, "library", missing)
    with pytest.raises(BundleError, match=r"specrt's own operators, which are unavailable: no C compiler") as err:
        open_session(graph)
    assert "\n" not in str(err.value)


def _session_model_bytes(blocks: np.ndarray) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("MatMulQ6_K", ["A", "B"], ["Y"], domain=ggml_ops.DOMAIN)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "S", 768])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(blocks, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ggml_ops.DOMAIN, 1)]).SerializeToString()


def test_the_layout_writer_and_the_kernels_agree(lib):
    """ggml_ops/layout.py places each byte where ggml_kernels.c reads it (one map written twice: once in C for the
    kernels, once in numpy for conversion), and reading back returns the file's blocks."""
    lib.specrt_ggml_group_offset.restype = ctypes.c_int64
    rng = np.random.default_rng(5)
    for qtype, number in TYPE_NUMBER.items():
        size = layout.BLOCK_BYTES[qtype]
        c_map = [[lib.specrt_ggml_group_offset(number, r, j) for j in range(size)] for r in range(layout.ROWS)]
        assert c_map == [[layout.offset(qtype, r, j) for j in range(size)] for r in range(layout.ROWS)], qtype
        blocks = rng.integers(0, 256, (13, 3 * size), dtype=np.uint8)  # 13 rows: a last group of 5 and 3 padding
        packed = layout.interleave(qtype, blocks)
        assert packed.shape == (2, 3 * size * layout.ROWS)
        assert np.array_equal(layout.deinterleave(qtype, packed, 13), blocks)
