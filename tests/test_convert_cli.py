"""`specrt convert / info / models` on tiny models, and every bad input the issue lists."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specrt.bundle import MANIFEST, SCHEMA_VERSION, load_bundle
from specrt.cli import main
from tests.tiny_models import save_tiny_bundle_source


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory) -> Path:
    return save_tiny_bundle_source("llama", tmp_path_factory.mktemp("src") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny_bundle(tiny_source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "b"
    assert main(["convert", str(tiny_source), "-o", str(out), "--max-context", "128", "--hidden-layers", "0,2"]) == 0
    return out


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_convert_writes_a_complete_validated_bundle(tiny_bundle):
    m = load_bundle(tiny_bundle)
    assert m.schema_version == SCHEMA_VERSION
    assert m.architecture == "llama" and m.target.precision == "fp32"
    assert m.kv.max_context == 128 and m.kv.layers == 3
    assert m.target.hidden_layers == (0, 2) and "hidden_states" in m.target.outputs
    assert m.stop_token_ids and m.stop_token_ids[0] == 2
    assert m.chat_template and "im_start" in m.chat_template
    assert m.provenance["validation"]["source"]["max_abs_diff"] <= 1e-3
    assert set(m.files) >= {"target.onnx", "target.onnx.data", "tokenizer.json"}


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_convert_other_architectures_int4(arch, tmp_path, capsys):
    src = save_tiny_bundle_source(arch, tmp_path / arch)
    code, _, err = run(["convert", str(src), "-o", str(tmp_path / "b"), "--precision", "int4", "--max-context", "64"], capsys)
    assert code == 0, err
    m = load_bundle(tmp_path / "b")
    assert m.target.precision == "int4"
    assert m.provenance["validation"]["quantized_reference"]["top1_agreement"] >= 0.95


def test_info_prints_and_validates(tiny_bundle, capsys):
    code, out, _ = run(["info", str(tiny_bundle)], capsys)
    assert code == 0
    assert "llama" in out and "max context 128" in out and "sha256 checked" in out


def test_models_lists_the_catalog(capsys):
    code, out, _ = run(["models"], capsys)
    assert code == 0
    assert "smollm2-135m-instruct" in out and "(default)" in out and "gemma3-270m" in out


def test_existing_output_is_refused_then_replaced_with_force(tiny_source, tmp_path, capsys):
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run(["convert", str(tiny_source), "-o", str(out), "--max-context", "64"], capsys)
    assert code == 2 and "already exists" in err and err.count("\n") == 1
    assert (out / "keep.txt").read_text() == "mine"
    code, _, err = run(["convert", str(tiny_source), "-o", str(out), "--max-context", "64", "--force"], capsys)
    assert code == 0, err
    assert not (out / "keep.txt").exists() and (out / MANIFEST).is_file()
    assert leftovers(tmp_path) == ["b"]


@pytest.mark.parametrize(
    "make_source, message",
    [
        (lambda d: d / "nope", "no such file or folder"),
        (lambda d: d / "missing.gguf", "no such file"),
        (lambda d: "not-a-model", "catalog"),
    ],
)
def test_missing_source(make_source, message, tmp_path, capsys):
    code, _, err = run(["convert", str(make_source(tmp_path)), "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "b").exists()


def test_unsupported_architecture_names_the_supported_ones(tiny_source, tmp_path, capsys):
    src = tmp_path / "gpt2"
    src.mkdir()
    cfg = json.loads((tiny_source / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    (src / "model.safetensors").write_bytes((tiny_source / "model.safetensors").read_bytes())
    code, _, err = run(["convert", str(src), "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and "unsupported architecture 'gpt2'" in err and "llama" in err


def test_corrupt_safetensors_and_pickle_only(tiny_source, tmp_path, capsys):
    src = tmp_path / "corrupt"
    src.mkdir()
    (src / "config.json").write_text((tiny_source / "config.json").read_text())
    (src / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    code, _, err = run(["convert", str(src), "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and "model.safetensors: not a safetensors file" in err
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"pickle bytes that are never loaded")
    code, _, err = run(["convert", str(src), "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and "safetensors only" in err
    assert leftovers(tmp_path) == ["corrupt"]


def test_corrupt_gguf(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    code, _, err = run(["convert", str(bad), "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and "GGUF" in err
    assert leftovers(tmp_path) == ["bad.gguf"]


def test_failed_validation_leaves_nothing(tiny_source, tmp_path, capsys, monkeypatch):
    import specrt.convert.validate as validate

    monkeypatch.setattr(validate, "FP32_MAX_ABS", -1.0)
    code, _, err = run(["convert", str(tiny_source), "-o", str(tmp_path / "b"), "--max-context", "64"], capsys)
    assert code == 2 and "bundle not written" in err
    assert leftovers(tmp_path) == []


def test_full_disk_leaves_nothing(tiny_source, tmp_path, capsys, monkeypatch):
    import onnx

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", no_space)
    code, _, err = run(["convert", str(tiny_source), "-o", str(tmp_path / "b"), "--max-context", "64"], capsys)
    assert code == 2 and "disk full" in err
    assert leftovers(tmp_path) == []


def test_interrupt_leaves_nothing(tiny_source, tmp_path, capsys, monkeypatch):
    import specrt.convert.pipeline as pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "write_tokenizer", interrupted)
    code, _, err = run(["convert", str(tiny_source), "-o", str(tmp_path / "b"), "--max-context", "64"], capsys)
    assert code == 130
    assert leftovers(tmp_path) == []


def test_fp16_on_cpu_and_a_gpu_bundle_without_its_provider(tiny_source, tmp_path, capsys):
    code, _, err = run(["convert", str(tiny_source), "-o", str(tmp_path / "b"), "--precision", "fp16"], capsys)
    assert code == 2 and "GPU" in err
    # no CUDA provider here: the bundle is built (fp16, the GPU's default) and validated on the CPU provider, said so
    code, _, err = run(["convert", str(tiny_source), "-o", str(tmp_path / "b"), "--device", "cuda"], capsys)
    assert code == 0 and "no CUDAExecutionProvider" in err and "validated on the CPU provider" in err
    manifest = json.loads((tmp_path / "b" / "specrt.json").read_text())
    assert manifest["target"]["precision"] == "fp16" and manifest["target"]["device"] == "cuda"


def test_damaged_bundles_are_named(tiny_bundle, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_bundle, copy)
    data = copy / "target.onnx.data"
    data.write_bytes(data.read_bytes()[:-10])
    code, _, err = run(["info", str(copy)], capsys)
    assert code == 2 and "target.onnx.data" in err and "truncated" in err
    manifest = json.loads((copy / MANIFEST).read_text())
    (copy / MANIFEST).write_text(json.dumps({**manifest, "schema_version": SCHEMA_VERSION + 1}))
    code, _, err = run(["info", str(copy)], capsys)
    assert code == 2 and "newer" in err
    (copy / MANIFEST).write_text("{broken")
    code, _, err = run(["info", str(copy)], capsys)
    assert code == 2 and "unreadable manifest" in err


def test_console_script_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specrt.cli", "convert", str(tmp_path / "nope"), "-o", str(tmp_path / "b")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1
