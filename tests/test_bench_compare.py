"""`specrt bench --compare` with fake systems plugged in (the real worker protocol, set decode times): order,
medians, speedup arithmetic, JSON schema, failure rows, the table and the plot."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from specrt.errors import SpecrtError
from specrt.app.bench import rotation, run_bench
from specrt.app.bench_plot import plot_report
from specrt.app.bench_report import format_markdown, format_table
from specrt.app.compare.environment import SystemUnavailable, ensure_environment
from specrt.app.compare.systems import ExternalSystem, Variant
from specrt.runtime.sampling import SamplingParams
from tests.tiny_models import save_tiny_bundle_source

WORKER = Path(__file__).resolve().parent / "fake_bench_worker.py"
PROMPTS = ["the cat and the dog", "a man in the house", "the world the world", "dog and cat", "a house"]


class FakeSystem(ExternalSystem):
    """Runs the fake worker with this Python (nothing to install); variants at the rates given."""

    worker = str(WORKER)

    def __init__(self, name: str, log: Path, rates: dict[str, float], **worker_options):
        self.name, self.log, self.rates, self.options = name, log, rates, worker_options

    def python(self, log):
        return Path(sys.executable)

    @property
    def script(self):
        return WORKER

    def variants(self, group, groups, ctx, python):
        return [Variant(d, group, {"name": f"{self.name}/{d}", "log": str(self.log), "tokens_per_second": r,
                                   **self.options}) for d, r in self.rates.items()]


class UninstallableSystem(ExternalSystem):
    name = "uninstallable"
    requirements = ("specrt-test-no-such-package==0.0.0",)
    worker = "never-started.py"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from specrt.cli import main

    src = save_tiny_bundle_source("llama", tmp_path_factory.mktemp("src") / "t", seed=0)
    out = tmp_path_factory.mktemp("b") / "bundle"
    assert main(["convert", str(src), "-o", str(out), "--max-context", "96"]) == 0
    return out


def _bench(bundle, systems, compare, prompts=PROMPTS, **kw):
    params = SamplingParams(max_new_tokens=12, stop_token_ids=())
    return run_bench(str(bundle), {"fake-set": prompts}, ["ngram"], ["fp32"], params, device="cpu",
                     compare=compare, systems=systems, log=lambda m: None, **kw)


def test_rotation_gives_every_system_every_slot():
    orders = [rotation(["A", "B", "C"], i) for i in range(4)]
    assert orders == [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]


def test_compared_rows_order_medians_and_speedups(bundle, tmp_path):
    log = tmp_path / "calls.jsonl"
    fake = FakeSystem("fake", log, {"none": 1000.0, "prompt-lookup": 250.0})
    # a fixed draft length: the adaptive loop's timing could switch drafting off on a slow or busy machine
    report = _bench(bundle, {"fake": fake}, ["fake"], draft_length=3)
    rows = report["results"]
    assert [(r["system"], r["drafter"]) for r in rows] == [
        ("specrt", "none"), ("specrt", "ngram"), ("fake", "none"), ("fake", "prompt-lookup")]
    keys = {"system", "drafter", "precision", "dataset", "prompts", "tokens_per_second", "tokens_per_second_range",
            "tokens_per_second_by_prompt", "mean_accepted", "speedup", "min_speedup", "max_speedup",
            "acceptance_by_position", "identical_to_plain"}
    for r in rows:
        assert keys <= set(r) and r["dataset"] == "fake-set" and r["prompts"] == len(PROMPTS)
        assert r["precision"] == "fp32"
    plain, ngram, fast, slow = rows
    assert fast["version"] == "fake-1.0" and fast["mean_accepted"] is None and fast["acceptance_by_position"] == []
    assert fast["tokens_per_second"] == pytest.approx(1000.0) and fast["tokens_per_second_range"] == pytest.approx([1000, 1000])
    assert slow["tokens_per_second"] == pytest.approx(250.0)
    # speedup: the median over prompts of (this row's tokens/s) / (specrt plain's, same prompt)
    expected = statistics.median(1000.0 / p for p in plain["tokens_per_second_by_prompt"])
    assert fast["speedup"] == pytest.approx(expected)
    assert fast["min_speedup"] == pytest.approx(1000.0 / max(plain["tokens_per_second_by_prompt"]))
    assert slow["speedup"] == pytest.approx(expected / 4)
    assert plain["speedup"] == 1.0
    assert plain["tokens_per_second"] == pytest.approx(statistics.median(plain["tokens_per_second_by_prompt"]), rel=1e-5)
    assert ngram["identical_to_plain"] == len(PROMPTS)  # specrt's drafter is lossless
    # wasted: rejected draft tokens per target call = drafted per call - (tokens per call - 1)
    assert plain["wasted_per_call"] == 0.0 and fast["wasted_per_call"] is None
    assert ngram["drafted_per_call"] > ngram["wasted_per_call"] > 0.0
    assert ngram["wasted_per_call"] == pytest.approx(ngram["drafted_per_call"] - (ngram["mean_accepted"] - 1))
    assert fast["identical_to_plain"] == 0  # the fake's tokens are not the model's
    # the harness asked in rotated order: a warm-up (8 tokens) per variant, then one call per prompt
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["max_new"] for c in calls] == [8, 8] + [12] * 2 * len(PROMPTS)
    contestants = ["specrt/none", "specrt/ngram", "fake/none", "fake/prompt-lookup"]
    expected_order = [n for i in range(len(PROMPTS)) for n in rotation(contestants, i) if n.startswith("fake")]
    assert [c["name"] for c in calls[2:]] == expected_order
    assert expected_order[6:8] == ["fake/prompt-lookup", "fake/none"]  # the order really changes


def test_failures_become_rows_and_the_others_finish(bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "calls.jsonl"
    systems = {"uninstallable": UninstallableSystem(),
               "broken": FakeSystem("broken", log, {"none": 100.0}, fail_load=True),
               "flaky": FakeSystem("flaky", log, {"none": 100.0}, fail_at=3),
               "fine": FakeSystem("fine", log, {"none": 100.0})}
    report = _bench(bundle, systems, list(systems))
    rows = {r["system"]: r for r in report["results"]}
    assert "could not install specrt-test-no-such-package==0.0.0" in rows["uninstallable"]["error"]
    assert "this fake system does not load" in rows["broken"]["error"]
    assert "fake failure at call 3" in rows["flaky"]["error"]
    assert "error" not in rows["fine"] and rows["fine"]["prompts"] == len(PROMPTS)
    assert rows["specrt"]["prompts"] == len(PROMPTS)
    table = format_table(report)
    assert "uninstallable" in table and "not run: not installed: could not install" in table
    md = format_markdown(report, "specrt bench x")
    assert md.startswith("`specrt bench x`") and "| fake-set | fine | none | fp32 |" in md
    assert "not run: RuntimeError: fake failure at call 3" in md
    out = tmp_path / "plot.png"
    plot_report(report, out)  # error rows are left out of the plot, not drawn as zeros
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_several_datasets_one_report_and_plot(bundle, tmp_path):
    fake = FakeSystem("fake", tmp_path / "calls.jsonl", {"none": 500.0})
    params = SamplingParams(max_new_tokens=6, stop_token_ids=())
    report = run_bench(str(bundle), {"a": PROMPTS[:2], "b": PROMPTS[2:]}, [], ["fp32"], params, device="cpu",
                       compare=["fake"], systems={"fake": fake}, log=lambda m: None)
    assert report["datasets"] == {"a": 2, "b": 3} and report["prompts"] == 5
    assert [(r["dataset"], r["system"]) for r in report["results"]] == [
        ("a", "specrt"), ("a", "fake"), ("b", "specrt"), ("b", "fake")]
    json.dumps(report)  # the whole report is JSON
    out = tmp_path / "plot.png"
    plot_report(report, out)
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_compare_refuses_unknown_systems_and_sampling(bundle):
    with pytest.raises(SpecrtError, match="unknown system 'vllm'"):
        _bench(bundle, {}, ["vllm"])
    params = SamplingParams(max_new_tokens=4, temperature=0.8)
    with pytest.raises(SpecrtError, match="greedy"):
        run_bench(str(bundle), {"a": PROMPTS}, [], ["fp32"], params, compare=["fake"],
                  systems={"fake": FakeSystem("fake", Path("/dev/null"), {})})


def test_environment_is_reused_once_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path))
    messages = []
    python = ensure_environment("empty", (), messages.append)
    assert python.is_file() and any("installing empty" in m for m in messages)
    # layered over the running Python's environment (a virtual environment in CI), behind its own site-packages
    import site
    import subprocess

    probe = "import sys, numpy; print(numpy.__file__); print(sys.prefix)"
    numpy_file, prefix = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                                        check=True).stdout.split()
    assert any(numpy_file.startswith(p) for p in site.getsitepackages())
    assert Path(prefix) == python.parent.parent  # its own environment, not the running one
    messages.clear()
    assert ensure_environment("empty", (), messages.append) == python and messages == []
    # specrt now runs from another environment (the one it was layered over is gone): layered over this one again
    [pth] = python.parent.parent.glob("lib/python*/site-packages/_specrt_parent.pth")
    pth.write_text("/nonexistent/site-packages\n")
    assert ensure_environment("empty", (), messages.append) == python and messages == []
    subprocess.run([str(python), "-c", "import numpy"], check=True)
    with pytest.raises(SystemUnavailable, match="could not install"):
        ensure_environment("empty", ("specrt-test-no-such-package==0.0.0",), messages.append)


def test_repeats_run_mirrored_rounds_and_pool_them(bundle, tmp_path):
    log = tmp_path / "calls.jsonl"
    fake = FakeSystem("fake", log, {"none": 400.0, "prompt-lookup": 100.0})
    report = _bench(bundle, {"fake": fake}, ["fake"], prompts=PROMPTS[:3], repeats=2)
    assert report["repeats"] == 2 and "2 rounds per prompt" in format_table(report)
    rows = {(r["system"], r["drafter"]): r for r in report["results"]}
    assert all(r["prompts"] == 3 for r in rows.values())  # rounds pool into one figure per prompt
    assert rows[("fake", "none")]["tokens_per_second"] == pytest.approx(400.0)
    # each prompt: the rotated order, then the same order mirrored
    contestants = ["specrt/none", "specrt/ngram", "fake/none", "fake/prompt-lookup"]
    expected = [n for i in range(3) for order in [rotation(contestants, i)] for n in order + order[::-1]
                if n.startswith("fake")]
    calls = [json.loads(line)["name"] for line in log.read_text().splitlines()][2:]  # after the warm-ups
    assert calls == expected and calls[:4] == ["fake/none", "fake/prompt-lookup", "fake/prompt-lookup", "fake/none"]
    ngram = rows[("specrt", "ngram")]
    assert ngram["identical_to_plain"] == 3
    with pytest.raises(SpecrtError, match="--repeats"):
        _bench(bundle, {"fake": fake}, ["fake"], repeats=0)


def test_pooled_rate_is_all_tokens_over_all_seconds():
    from specrt.app.bench import pooled_rate
    from specrt.app.bench_contestants import Sample

    # 10 tokens at 10 tok/s (1 s) and 30 tokens at 60 tok/s (0.5 s): 40 tokens in 1.5 s
    samples = [Sample(list(range(10)), 10.0), Sample(list(range(30)), 60.0)]
    assert pooled_rate(samples) == pytest.approx(40 / 1.5)
    assert pooled_rate(samples[:1]) == 10.0
    assert pooled_rate([Sample([1, 2], 5.0), Sample([1, 2], 0.0)]) == 0.0
