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
    """int4 and fp32 bundles of the real default model, converted once per test session."""
    from specrt.cli import main

    root = tmp_path_factory.mktemp("real")
    out = {"int4": root / "int4", "fp32": root / "fp32"}
    # without the catalog's EAGLE-3 head (its hidden-state outputs would keep the graph from serving as a draft model)
    assert main(["convert", "smollm2-135m-instruct", "-o", str(out["int4"]), "--precision", "int4",
                 "--drafter", "none"]) == 0
    # the fp32 bundle carries the int4 graph as its draft model (self-int4 drafting, copied, not reconverted)
    assert main(["convert", "smollm2-135m-instruct", "-o", str(out["fp32"]), "--precision", "fp32",
                 "--drafter", f"draft-model:{out['int4']}"]) == 0
    return out


@pytest.fixture(scope="session")
def hf_gguf_model():
    """transformers' own GGUF loader on the same file: the reference for greedy equality."""
    from transformers import AutoModelForCausalLM

    from specrt.catalog import fetch

    gguf = fetch("smollm2-135m-instruct")
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()


# Triton kernels run on the CPU through Triton's interpreter unless a GPU run asks for native kernels.
# (Set before any test module imports triton: the decorator reads it.)
if os.environ.get("SPECRT_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
