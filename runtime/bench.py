"""`specrt bench`: plain decoding and each drafter on the same prompts, interleaved, side by side.

Per precision one engine is loaded; for every prompt each system (plain decoding first in the list, the
drafters after) generates once from a reset cache, in an order rotated by one per prompt so that a slow
stretch of this shared machine does not land on one system. Reported per system: tokens/s (median over
prompts, decode phase), mean accepted tokens per target call and acceptance by draft depth (all prompts
pooled), speedup (median of the
per-prompt ratio to plain decoding in the same run), and at temperature 0 how many outputs equal plain
decoding's token for token. Timing is for people to read; no test asserts on it.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from dataclasses import dataclass, field

from specrt.bundle import MANIFEST, load_bundle
from specrt.errors import SpecrtError
from specrt.runtime.api import check_drafter_name, make_drafter, resolve_bundle
from specrt.runtime.engine import Engine
from specrt.runtime.providers import providers_for
from specrt.runtime.sampling import SamplingParams


@dataclass
class SystemRuns:
    drafter: str
    precision: str
    tokens_per_second: list[float] = field(default_factory=list)
    produced: int = 0  # tokens the decode-phase target calls produced
    calls: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)  # by draft depth, pooled over prompts
    accepted: list[float] = field(default_factory=list)

    def add(self, result) -> None:
        s = result.stats
        for d, (share, n) in enumerate(zip(s.acceptance_by_position, s.drafted_by_position)):
            if d == len(self.drafted):
                self.drafted.append(0)
                self.accepted.append(0.0)
            self.drafted[d] += n
            self.accepted[d] += share * n
        self.tokens_per_second.append(s.tokens_per_second)
        self.produced += round(s.mean_accepted * s.target_calls)
        self.calls += s.target_calls
        self.outputs.append(result.token_ids)


def is_bundle(model: str) -> bool:
    from pathlib import Path

    return (Path(model).expanduser() / MANIFEST).is_file()


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(model: str, precision: str, drafters: list[str], device: str, threads: int, stages, batch_invariant: bool):
    """Engine and drafter objects for one precision; drafters the bundle cannot serve are skipped with a note."""
    providers = providers_for(device)
    wanted = [d for d in drafters if d != "none"]
    try:
        bundle = resolve_bundle(model, precision, stages, drafter="draft-model" if "draft-model" in wanted else None)
    except SpecrtError as exc:
        if "draft-model" not in wanted:
            raise
        _log(f"skipping draft-model at {precision}: {exc}")
        wanted.remove("draft-model")
        bundle = resolve_bundle(model, precision, stages)
    manifest = load_bundle(bundle, check_hashes=False)
    engine = Engine(bundle, manifest, providers, threads=threads, batch_invariant=batch_invariant)
    objects = {"none": None}
    for name in wanted:
        try:
            objects[name] = make_drafter(name, bundle, manifest, providers, threads)
        except SpecrtError as exc:  # e.g. a tree on an int4 graph: noted, not silently dropped
            _log(f"skipping {name} at {manifest.target.precision}: {exc}")
    return engine, objects, manifest.target.precision


def _generate(engine: Engine, prompt: str, params: SamplingParams, drafter):
    engine.reset()  # every system prefills the whole prompt: no prefix reuse across systems
    return engine.generate(prompt, params, drafter=drafter).wait()


def run_bench(model: str, prompts: list[str], drafters: list[str], precisions: list[str], params: SamplingParams,
              device: str = "auto", threads: int = 0, stages=None, log=_log, batch_invariant: bool = False) -> dict:
    for d in drafters:
        check_drafter_name(d)
    results = []
    if is_bundle(model):
        precisions = precisions[:1]  # a bundle folder has one precision: its own
    for precision in precisions:
        engine, objects, precision = _load(model, precision, drafters, device, threads, stages, batch_invariant)
        runs = {name: SystemRuns(name, precision) for name in objects}
        names = list(objects)
        for name in names:  # warm-up: first-call costs (allocation, thread start) stay out of the numbers
            _generate(engine, prompts[0], SamplingParams(max_new_tokens=8, temperature=params.temperature), objects[name])
        for i, prompt in enumerate(prompts):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                seeded = dataclasses.replace(params, seed=(params.seed or 0) + i)
                runs[name].add(_generate(engine, prompt, seeded, objects[name]))
            line = "  ".join(f"{n} {runs[n].tokens_per_second[-1]:.1f}" for n in names)
            log(f"[{precision} {i + 1}/{len(prompts)}] tok/s: {line}")
        results += _summarize(runs, params.greedy)
    return {"model": model, "prompts": len(prompts), "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature, "batch_invariant": batch_invariant,
            "machine": machine_info(providers_for(device)), "results": results}


def machine_info(providers) -> dict:
    """What the numbers were measured on: CPU model and cores, providers, library versions."""
    import os
    import platform

    import onnxruntime as ort

    from specrt import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "providers": list(providers), "onnxruntime": ort.__version__,
            "specrt": __version__, "python": platform.python_version()}


def _summarize(runs: dict[str, SystemRuns], greedy: bool) -> list[dict]:
    plain = runs["none"]
    rows = []
    for name, r in runs.items():
        ratios = [a / b for a, b in zip(r.tokens_per_second, plain.tokens_per_second) if b > 0]
        row = {"system": "specrt", "drafter": name, "precision": r.precision,
               "tokens_per_second": statistics.median(r.tokens_per_second),
               "mean_accepted": r.produced / r.calls if r.calls else 0.0,
               "speedup": statistics.median(ratios) if ratios else 0.0,
               "min_speedup": min(ratios) if ratios else 0.0,
               "acceptance_by_position": [round(a / n, 4) for a, n in zip(r.accepted, r.drafted) if n]}
        if greedy:
            row["identical_to_plain"] = sum(a == b for a, b in zip(r.outputs, plain.outputs))
        rows.append(row)
    return rows


def format_markdown(report: dict, command: str = "") -> str:
    """The results as a Markdown table (for docs), with the command and the machine above it."""
    m = report.get("machine", {})
    lines = []
    if command:
        lines += [f"`{command}`", ""]
    lines += [f"{report['model']}, {report.get('dataset', 'prompts file')}: {report['prompts']} prompts x "
              f"{report['max_new_tokens']} new tokens, temperature {report['temperature']}"
              + (", batch-invariant" if report.get("batch_invariant") else "")
              + (f"; {m.get('cpu')}, {m.get('cores')} cores, onnxruntime {m.get('onnxruntime')}" if m else ""), ""]
    greedy = report["temperature"] == 0
    lines.append("| drafter | precision | tok/s | mean accepted | speedup | min | acceptance by depth |"
                 + (" identical |" if greedy else ""))
    lines.append("|---|---|---|---|---|---|---|" + ("---|" if greedy else ""))
    for r in report["results"]:
        depth = " / ".join(f"{a:.2f}" for a in r.get("acceptance_by_position", []))
        line = (f"| {r['drafter']} | {r['precision']} | {r['tokens_per_second']:.1f} | {r['mean_accepted']:.2f} | "
                f"{r['speedup']:.2f}x | {r['min_speedup']:.2f}x | {depth} |")
        if greedy:
            line += f" {r['identical_to_plain']}/{report['prompts']} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def format_table(report: dict) -> str:
    head = f"{'drafter':<12} {'precision':<9} {'tok/s':>8} {'mean acc':>9} {'speedup':>8} {'min':>6}"
    greedy = report["temperature"] == 0
    head += "  identical" if greedy else ""
    lines = [f"{report['model']}: {report['prompts']} prompts x {report['max_new_tokens']} new tokens, "
             f"temperature {report['temperature']}", head]
    for r in report["results"]:
        line = (f"{r['drafter']:<12} {r['precision']:<9} {r['tokens_per_second']:>8.1f} {r['mean_accepted']:>9.2f} "
                f"{r['speedup']:>7.2f}x {r['min_speedup']:>5.2f}x")
        if greedy:
            line += f"  {r['identical_to_plain']}/{report['prompts']}"
        lines.append(line)
    return "\n".join(lines)
