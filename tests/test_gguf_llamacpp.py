"""The GGUF layouts specrt reads, held to llama.cpp itself (full tier: llama-cpp-python is installed into its own
environment on first use): tiny random models from transformers' own classes, written as F32 GGUFs by the same
code that writes the files the reading tests convert (tests/gguf_writer.py, archs/qwen3_5_gguf.py), decode in
llama.cpp exactly as transformers decodes them. A layout we read differently from llama.cpp would part here."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.numpy import load_file

from tests.tiny_models import WORDS, hf_model

pytestmark = pytest.mark.full

IDS = [5, 9, 30, 41, 7, 60]
TOKENS = ["<|endoftext|>"] + list(WORDS[1:97])
DECODE = """
import json, sys
import llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, verbose=False, n_threads=2)
m.eval(json.loads(sys.argv[2]))
out = []
for _ in range(int(sys.argv[3])):
    t = int(m.sample(temp=0.0))
    out.append(t)
    m.eval([t])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def llama_python():
    from specrt.app.compare.environment import SystemUnavailable
    from specrt.app.compare.systems import SYSTEMS

    try:
        return SYSTEMS["llama.cpp"].python(lambda m: None)
    except SystemUnavailable as exc:
        pytest.fail(f"llama-cpp-python could not be installed: {exc}")


def _write(arch: str, layout: str, folder, path) -> None:
    from specrt.models.hf_loader import load_hf_folder
    from tests import gguf_writer

    model = hf_model(arch)
    model.save_pretrained(folder)
    if arch.startswith("qwen3_5"):
        hf, lazy = load_hf_folder(folder)  # per-expert names, as specrt reads a checkpoint
        gguf_writer.write_qwen35_gguf(path, hf, {n: lazy[n] for n in lazy}, TOKENS, eos=4,
                                      fused_experts=layout == "fused")
        return
    weights = load_file(str(folder / "model.safetensors"))
    writer = {"qwen3_moe_sparse": gguf_writer.write_qwen3moe_gguf, "gpt_oss": gguf_writer.write_gpt_oss_gguf}[arch]
    writer(path, model.config.to_dict(), weights, TOKENS, eos=4)


@pytest.mark.parametrize("arch, layout", [("qwen3_5_text", "qwen35"), ("qwen3_5_moe_text", "split"),
                                          ("qwen3_5_moe_text", "fused"), ("qwen3_moe_sparse", "qwen3moe"),
                                          ("gpt_oss", "gpt-oss")])
def test_llama_cpp_decodes_our_gguf_as_transformers_does(llama_python, tmp_path, arch, layout):
    _write(arch, layout, tmp_path / "hf", tmp_path / "m.gguf")
    model = hf_model(arch)
    with torch.no_grad():
        want = model.generate(torch.tensor([IDS]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(IDS):].tolist()
    run = subprocess.run([str(llama_python), "-c", DECODE, str(tmp_path / "m.gguf"), json.dumps(IDS), "24"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == want
