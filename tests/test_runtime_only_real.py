"""A runtime-only install (`pip install .`: onnxruntime, numpy, tokenizers, jinja2; no torch, transformers,
safetensors, onnx or gguf) runs every drafter of the shared real bundles, with the catalog's shipped heads, and
its greedy output equals plain decoding's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model

RUNNER = Path(__file__).resolve().parent / "runtime_only_cli.py"
PROMPT = "Write a haiku about the sea."


def _generate(bundle: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(RUNNER), "generate", str(bundle), "--prompt", PROMPT,
                           "--max-new-tokens", "24", "--json", "--device", "cpu", *args],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("module, result", [("safetensors", "blocked"), ("torch.nn", "blocked"),
                                            ("onnx", "blocked"), ("onnxruntime", "imported")])
def test_the_runner_blocks_the_conversion_packages(module, result):
    proc = subprocess.run([sys.executable, str(RUNNER), "--try-import", module], capture_output=True, text=True)
    assert proc.stdout.strip() == result


@pytest.mark.parametrize("precision, drafters", [
    ("int4", ["eagle3", "dflash", "dflash:prob", "ngram"]),
    ("fp32", ["eagle3", "eagle3:tree", "dflash", "draft-model", "draft-model+ngram", "ngram"]),
])
def test_every_drafter_runs_without_the_conversion_packages(bundles, precision, drafters):
    calls = ["--batch-invariant"] if precision == "int4" else []  # int4: exact calls, for the drafters and plain alike
    plain = _generate(bundles[precision], "--drafter", "none", *calls)
    for drafter in drafters:
        out = _generate(bundles[precision], "--drafter", drafter, *calls)
        assert out["stats"]["drafter"] == drafter
        assert out["token_ids"] == plain["token_ids"], drafter
