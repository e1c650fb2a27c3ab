"""Shared fixtures: tiny random models, an isolated specrt cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def real_cache() -> Path:
    """The cache that holds the real default model (shared across tests and runs)."""
    return Path(os.environ.get("SPECRT_CACHE") or Path.home() / ".cache" / "specrt")


@pytest.fixture(scope="session")
def bundles(tmp_path_factory):
    """fp32 and int4 bundles of the real default model, converted once per test session."""
    from specrt.cli import main

    root = tmp_path_factory.mktemp("real")
    out = {}
    for precision in ("fp32", "int4"):
        path = root / precision
        assert main(["convert", "smollm2-135m-instruct", "-o", str(path), "--precision", precision]) == 0
        out[precision] = path
    return out


@pytest.fixture(scope="session")
def hf_gguf_model():
    """transformers' own GGUF loader on the same file: the reference for greedy equality."""
    from transformers import AutoModelForCausalLM

    from specrt.catalog import fetch

    gguf = fetch("smollm2-135m-instruct")
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
