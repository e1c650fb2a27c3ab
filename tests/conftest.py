"""Shared fixtures: the test tiers, the real default model's bundles (converted once per run), tiny models.

Two tiers, one suite. The default tier (what `bash .ci/run` runs) keeps the real model in, with short runs; tests
marked `full` (the long real-model matrices, Gemma 3, every compared system, the datasets, the Qwen pair) run
only with SPECRT_FULL=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FULL = os.environ.get("SPECRT_FULL") == "1"
DEFAULT_MODEL = "smollm2-135m-instruct"
EAGLE3_HEAD = ROOT / "specrt" / "drafters" / "eagle3" / "heads" / DEFAULT_MODEL
DFLASH_HEAD = ROOT / "specrt" / "drafters" / "dflash" / "heads" / DEFAULT_MODEL


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason="full tier: runs with SPECRT_FULL=1")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


def _convert(root: Path, name: str, *args: str) -> Path:
    from specrt.cli import main

    out = root / name
    assert main(["convert", DEFAULT_MODEL, "-o", str(out), *args]) == 0
    return out


@pytest.fixture(scope="session")
def real_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real")


@pytest.fixture(scope="session")
def int4_bundle(real_root) -> Path:
    """What `specrt chat` runs on a fresh machine: the catalog's int4 conversion of the default model, with its
    shipped EAGLE-3 head and DFlash drafter (int4 too). Converted once per test run, shared by every test."""
    return _convert(real_root, "int4", "--precision", "int4")


@pytest.fixture(scope="session")
def fp32_bundle(real_root) -> Path:
    """The default model at fp32 with every drafter it has: the shipped EAGLE-3 head and DFlash drafter, and its
    own int4 graph as a draft model (self-int4). Converted once per test run, shared by every test."""
    return _convert(real_root, "fp32", "--precision", "fp32", "--drafter", f"eagle3:{EAGLE3_HEAD}",
                    "--drafter", f"dflash:{DFLASH_HEAD}", "--drafter", "draft-model:self-int4")


@pytest.fixture(scope="session")
def bundles(int4_bundle, fp32_bundle) -> dict[str, Path]:
    return {"int4": int4_bundle, "fp32": fp32_bundle}


@pytest.fixture(scope="session")
def hf_gguf_model():
    """transformers' own GGUF loader on the same file: the reference for greedy equality."""
    from transformers import AutoModelForCausalLM

    from specrt.catalog import fetch

    gguf = fetch(DEFAULT_MODEL)
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()


# Triton kernels run on the CPU through Triton's interpreter unless a GPU run asks for native kernels.
# (Set before any test module imports triton: the decorator reads it.)
if os.environ.get("SPECRT_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
