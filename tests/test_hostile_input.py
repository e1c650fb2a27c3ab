"""Hostile input: malformed GGUF and safetensors files and config values get a one-line SourceError within seconds,
never an internal error, a hang or a memory blow-up. The repros of issue 23 (each mutant of a tiny GGUF written
the way llama.cpp lays one out), then a seeded mutation fuzzer (tests/fuzz_formats.py, in a memory-capped
subprocess): a few hundred cases per format in the default tier, thousands in the full tier."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from specrt.errors import SourceError
from specrt.models.config import config_from_hf
from specrt.models.gguf_loader import load_gguf
from tests.conftest import FULL, ROOT
from tests.gguf_writer import write_gguf
from tests.tiny_models import COMMON, hf_model

FUZZ_CASES = 3000 if FULL else 300


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> bytes:
    hf = hf_model("llama")
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, "llama", hf.config, weights, lambda name, w: (w, None), tokens=[f"t{i}" for i in range(97)])
    return path.read_bytes()


def _value_at(data: bytes, key: str) -> int:
    """Offset of metadata KEY's value type (a u32 right after the key's name)."""
    return data.index(key.encode()) + len(key)


def _put(data: bytes, at: int, fmt: str, value) -> bytes:
    packed = struct.pack(fmt, value)
    return data[:at] + packed + data[at + len(packed):]


def _set(data: bytes, key: str, fmt: str, value) -> bytes:  # a scalar's value follows its u32 type
    return _put(data, _value_at(data, key) + 4, fmt, value)


REPROS = {
    # the repros: each was an internal error or a hang before
    "tensor_count 0": (lambda d: _put(d, 8, "<Q", 0), "no token_embd.weight tensor"),
    "head_count_kv 0": (lambda d: _set(d, "llama.attention.head_count_kv", "<I", 0), "num_kv_heads = 0"),
    "rope.freq_base 0": (lambda d: _set(d, "llama.rope.freq_base", "<f", 0.0), "rope_theta = 0.0"),
    "head_count 1000": (lambda d: _set(d, "llama.attention.head_count", "<I", 1000), "head_dim = 0"),
    "block_count 0": (lambda d: _set(d, "llama.block_count", "<I", 0), "block_count = 0"),
    "block_count 2^31-1": (lambda d: _set(d, "llama.block_count", "<I", 0x7FFFFFFF), "block_count = 2147483647"),
    "array length 2^32": (lambda d: _put(d, _value_at(d, "tokenizer.ggml.tokens") + 8, "<Q", 1 << 32),
                          "declares 4294967296 items"),
    "value type 9": (lambda d: _put(d, _value_at(d, "llama.context_length"), "<I", 9), "llama.context_length"),
    "rms_norm_eps inf": (lambda d: _set(d, "llama.attention.layer_norm_rms_epsilon", "<f", float("inf")),
                         "rms_norm_eps = inf"),
    "value type 13": (lambda d: _put(d, _value_at(d, "llama.context_length"), "<I", 13), "unknown value type 13"),
    "tensor with 9 dims": (lambda d: _put(d, d.index(b"token_embd.weight") + len("token_embd.weight"), "<I", 9),
                           "declares 9 dimensions"),
    "version 7": (lambda d: _put(d, 4, "<I", 7), "GGUF version 7"),
}


@pytest.mark.parametrize("name", list(REPROS))
def test_gguf_repro_is_one_line_error(tiny_gguf, tmp_path, name):
    mutate, message = REPROS[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(mutate(tiny_gguf))
    t0 = time.perf_counter()
    with pytest.raises(SourceError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        _, weights, _ = load_gguf(path)
        for w in weights:
            weights[w]
    assert "\n" not in str(caught.value)
    assert time.perf_counter() - t0 < 30  # a guard against the hangs the issue found, not a speed claim


def test_the_unmutated_file_loads(tiny_gguf, tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(tiny_gguf)
    hf, weights, _ = load_gguf(path)
    assert hf["num_hidden_layers"] == 3 and weights["model.embed_tokens.weight"].shape == (97, 64)


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": 0}, "malformed field"),  # hidden // 0
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps = nan"),
    ({"rope_theta": float("inf")}, "rope_theta = inf"),
    ({"num_hidden_layers": 10 ** 6}, "num_layers = 1000000 is out of range"),
    ({"hidden_size": "wide"}, "malformed field"),
    ({"vocab_size": -5}, "vocab_size = -5 is out of range"),
    ({"head_dim": 15}, "head_dim 15 is odd"),
])
def test_config_values_are_range_checked(change, message):
    hf = {**COMMON, "model_type": "llama", "rope_theta": 10000.0, **change}
    with pytest.raises(SourceError, match=message):
        config_from_hf(hf)


def test_config_must_be_an_object():
    with pytest.raises(SourceError, match="expected a JSON object"):
        config_from_hf(["llama"])


def _fuzz(fmt: str, seed_file: Path, cases: int, seed: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz_formats", fmt, str(seed_file), str(cases), str(seed)],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fuzz_gguf(tiny_gguf, tmp_path):
    seed = tmp_path / "seed.gguf"
    seed.write_bytes(tiny_gguf)
    counts = _fuzz("gguf", seed, FUZZ_CASES, 1)
    print(f"gguf fuzz: tried {counts['tried']}, clean {counts['clean']}, loaded {counts['loaded']}, other "
          f"{len(counts['other'])}; slowest case {counts['slowest_s']} s")
    assert counts["tried"] == FUZZ_CASES and counts["other"] == []
    assert counts["clean"] > FUZZ_CASES // 4  # the mutations reach the checks, not only harmless bytes


def test_fuzz_safetensors(tmp_path):
    from safetensors.numpy import save_file

    seed = tmp_path / "seed.safetensors"
    rng = np.random.default_rng(0)
    save_file({"a.weight": rng.normal(size=(8, 4)).astype(np.float32), "b.bias": np.arange(5, dtype=np.int64),
               "c": rng.normal(size=(3,)).astype(np.float16)}, str(seed))
    counts = _fuzz("safetensors", seed, FUZZ_CASES, 2)
    print(f"safetensors fuzz: tried {counts['tried']}, clean {counts['clean']}, loaded {counts['loaded']}, other "
          f"{len(counts['other'])}; slowest case {counts['slowest_s']} s")
    assert counts["tried"] == FUZZ_CASES and counts["other"] == []
    assert counts["clean"] > FUZZ_CASES // 4
