"""`specrt bench`: plain decoding, each drafter and (with --compare) other systems on the same prompts, side by side.

Per precision one engine is loaded; for every prompt each contestant (specrt's plain decoding first, its drafters,
then the compared systems' variants) generates from a reset cache, in an order rotated by one per prompt
(A B C, B C A, ...) so that a slow stretch of this shared machine does not land on one system. With repeats > 1
each prompt runs that many rounds, every other one in mirrored order (A B C, C B A, ...), and a contestant's
tokens/s on the prompt pools its rounds (all tokens over all decode seconds): a drift of the machine's speed
within a prompt then falls on every contestant alike. Every system gets
the same prompt token ids (specrt's chat template) and the same number of new tokens, greedy. Reported per row
and dataset: tokens/s (median over prompts, decode phase, and its range), mean accepted tokens per target call
and acceptance by draft depth (specrt's drafters, all prompts pooled), speedup (median of the per-prompt ratio
to specrt's plain decoding at that precision in the same run, and its range), and at temperature 0 how many
outputs equal specrt's plain decoding token for token. Timing is for people to read; no test asserts on it.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specrt import drafter_kinds
from specrt.bundle import MANIFEST, load_bundle
from specrt.errors import SpecrtError
from specrt.app.api import (DEFAULT_BATCH_INVARIANT, check_draft_length, check_drafter_name, make_drafter,
                            resolve_bundle)
from specrt.app.bench_contestants import SpecrtContestant, start_external
from specrt.app.bench_replay import DEFAULT_DRAFT_TOKENS
from specrt.app.compare.environment import SystemUnavailable
from specrt.runtime.drafter import common_prefix
from specrt.runtime.engine import Engine
from specrt.runtime.providers import profile_of, providers_for
from specrt.runtime.sampling import SamplingParams


@dataclass
class SystemRuns:
    system: str
    drafter: str
    precision: str
    version: str = ""
    batch_invariant: bool | None = None  # specrt rows: every target call fed >= 2 rows
    tokens_per_second: list[float] = field(default_factory=list)
    produced: int = 0  # tokens the decode-phase target calls produced (specrt only)
    calls: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)  # by draft depth, pooled over prompts
    accepted: list[float] = field(default_factory=list)
    steps_by_drafter: dict[str, int] = field(default_factory=dict)  # decode steps per member drafter; "none": plain
    drafted_total: int = 0  # another system's draft tokens, and those accepted, by its own count
    accepted_total: int = 0
    error: str | None = None

    def add(self, samples: list) -> None:
        """One prompt's rounds: tokens/s pooled over them, the first round's output, every round's statistics."""
        self.tokens_per_second.append(pooled_rate(samples))
        self.outputs.append(samples[0].token_ids)
        for sample in samples:
            if sample.stats is not None:
                self._add_stats(sample.stats)
            elif sample.draft is not None:
                self._add_count(len(sample.token_ids), *sample.draft)

    def _add_count(self, tokens: int, drafted: int, accepted: int) -> None:
        """Another system's own draft count: each decode call yields its own token and the drafts it accepted,
        so its calls are the tokens after the first less the accepted ones."""
        self.produced += tokens - 1
        self.calls += tokens - 1 - accepted
        self.drafted_total += drafted
        self.accepted_total += accepted

    def _add_stats(self, s) -> None:
        for d, (share, n) in enumerate(zip(s.acceptance_by_position, s.drafted_by_position)):
            if d == len(self.drafted):
                self.drafted.append(0)
                self.accepted.append(0.0)
            self.drafted[d] += n
            self.accepted[d] += share * n
        self.produced += round(s.mean_accepted * s.target_calls)
        self.calls += s.target_calls
        steps = dict(s.drafts_by_drafter, none=s.target_calls - 1 - sum(s.drafts_by_drafter.values()))
        for name, n in steps.items():
            self.steps_by_drafter[name] = self.steps_by_drafter.get(name, 0) + n


def pooled_rate(samples: list) -> float:
    """Tokens per second over several rounds of one prompt: all their tokens over all their decode seconds."""
    if len(samples) == 1:
        return samples[0].tokens_per_second
    tokens = [max(1, len(s.token_ids)) for s in samples]
    if any(s.tokens_per_second <= 0 for s in samples):
        return 0.0
    return sum(tokens) / sum(n / s.tokens_per_second for n, s in zip(tokens, samples))


def is_bundle(model: str) -> bool:
    return (Path(model).expanduser() / MANIFEST).is_file()


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(model: str, precision: str, drafters: list[str], device: str, threads: int, stages,
          draft_length: int | None = None):
    """Engine and drafter objects for one precision; drafters the bundle cannot serve are skipped with a note."""
    providers = providers_for(device)
    wanted = [d for d in drafters if d != "none"]
    drafting = [d for d in wanted if drafter_kinds.uses_catalog_draft_model(d)]  # rows that need the draft model
    try:
        bundle = resolve_bundle(model, precision, stages, drafter=drafting[0] if drafting else None,
                                device=profile_of(providers))
    except SpecrtError as exc:
        if not drafting:
            raise
        _log(f"skipping {', '.join(drafting)} at {precision}: {exc}")
        wanted = [d for d in wanted if d not in drafting]
        bundle = resolve_bundle(model, precision, stages, device=profile_of(providers))
    manifest = load_bundle(bundle, check_hashes=False)
    engine = Engine(bundle, manifest, providers, threads=threads, draft_length=draft_length)
    objects = {"none": None}
    for name in wanted:
        try:
            objects[name] = make_drafter(name, bundle, manifest, providers, threads)
            check_draft_length(draft_length, objects[name])
        except SpecrtError as exc:  # e.g. a tree on an int4 graph: noted, not silently dropped
            objects.pop(name, None)
            _log(f"skipping {name} at {manifest.target.precision}: {exc}")
    return engine, objects, manifest, bundle


def rotation(items: list, i: int) -> list:
    """The order of prompt i: the list rotated left by i (A B C, B C A, C A B, ...)."""
    k = i % len(items) if items else 0
    return items[k:] + items[:k]


def run_bench(model: str, prompt_sets: dict[str, list[str]], drafters: list[str], precisions: list[str],
              params: SamplingParams, device: str = "auto", threads: int = 0, stages=None, log=_log,
              batch_invariant: bool | None = None, compare: list[str] = (), systems: dict | None = None,
              draft_length: int | None = None, repeats: int = 1, synth_lengths: list[float] = ()) -> dict:
    """prompt_sets: dataset name -> prompts. compare: names in `systems` (default: compare.systems.SYSTEMS).
    batch_invariant: None runs each specrt row as specrt.load would (not batch-invariant); True or False sets it
    for every specrt row. draft_length: every drafter row drafts exactly this many
    tokens per target call (None: adaptive). repeats: rounds per prompt (every other one in mirrored order).
    synth_lengths: a row per length L at synthetic acceptance (bench_replay.py; llama-server's --spec-synth-len L),
    drafting draft_length tokens a call (default 3, llama-server's)."""
    from specrt.app.compare.systems import SYSTEMS

    systems = SYSTEMS if systems is None else systems
    for d in drafters:
        check_drafter_name(d)
    for name in compare:
        if name not in systems:
            raise SpecrtError(f"unknown system {name!r} for --compare (known: {', '.join(systems)})")
    if compare and not params.greedy:
        raise SpecrtError("--compare measures greedy decoding: use --temperature 0")
    if repeats < 1:
        raise SpecrtError("--repeats must be a positive integer")
    synth_tokens = draft_length or DEFAULT_DRAFT_TOKENS
    for length in synth_lengths:
        if not 1.0 <= length <= synth_tokens + 1:
            raise SpecrtError(f"--synth-len {length:g}: a mean tokens per call within [1, {synth_tokens + 1}] for "
                              f"{synth_tokens} draft tokens")
    if synth_lengths and not params.greedy:
        raise SpecrtError("--synth-len replays greedy decoding: use --temperature 0")
    pythons, install_errors = _install(compare, systems, log)
    results = []
    if is_bundle(model):  # a bundle folder has one precision: its own
        precisions = [load_bundle(Path(model).expanduser(), check_hashes=False).target.precision]
    groups = list(precisions)
    for precision in groups:
        engine, objects, manifest, bundle = _load(model, precision, drafters, device, threads, stages, draft_length)
        precision = manifest.target.precision
        contestants = [SpecrtContestant(engine, name, obj, precision, batch_invariant) for name, obj in objects.items()]
        if synth_lengths:
            contestants += _replay_rows(engine, manifest, bundle, synth_lengths, synth_tokens, precision,
                                        batch_invariant, device, threads)
        synth = {"lengths": list(synth_lengths), "draft_tokens": synth_tokens} if synth_lengths else None
        externals, error_rows = start_external(compare, systems, pythons, install_errors, precision, groups,
                                               manifest, bundle, engine, threads, log, synth)
        try:
            contestants += externals
            for dataset, prompts in prompt_sets.items():
                results += _run_dataset(dataset, prompts, contestants, engine, params, log, repeats)
        finally:
            for c in externals:
                c.close()
        results += error_rows
    return {"model": model, "datasets": {k: len(v) for k, v in prompt_sets.items()},
            "prompts": sum(len(v) for v in prompt_sets.values()), "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature, "batch_invariant": batch_invariant, "draft_length": draft_length,
            "repeats": repeats, "synth_lengths": list(synth_lengths),
            "machine": machine_info(providers_for(device)), "results": results}


def _replay_rows(engine, manifest, bundle, lengths, draft_tokens, precision, batch_invariant, device, threads):
    """A synthetic-acceptance row per length, each paying the cost of the bundle's draft model (else its first
    model drafter: EAGLE-3, MTP, DFlash, ...) for every draft."""
    from specrt.app.bench_replay import ReplayContestant

    kinds = [d.kind for d in manifest.drafters if d.known and drafter_kinds.KINDS[d.kind].exporter is not None]
    if not kinds:
        raise SpecrtError("--synth-len needs a drafter that drafts every step (a draft model, EAGLE-3, MTP, ...): "
                          "this bundle has none; convert it with --drafter")
    inner = next((k for k in kinds if drafter_kinds.KINDS[k].catalog_draft_model), kinds[0])
    obj = make_drafter(inner, bundle, manifest, providers_for(device), threads)
    exact = DEFAULT_BATCH_INVARIANT if batch_invariant is None else batch_invariant
    return [ReplayContestant(engine, length, draft_tokens, obj, inner, precision, exact) for length in lengths]


def _install(compare, systems, log) -> tuple[dict, dict]:
    pythons, errors = {}, {}
    for name in compare:
        try:
            pythons[name] = systems[name].python(log)
        except SystemUnavailable as exc:
            log(f"{name}: {exc}")
            errors[name] = str(exc)
    return pythons, errors


def _run_dataset(dataset, prompts, contestants, engine, params, log, repeats: int = 1) -> list[dict]:
    runs = {c.key: SystemRuns(c.system, c.drafter, c.precision, c.version, getattr(c, "batch_invariant", None))
            for c in contestants}
    warm = SamplingParams(max_new_tokens=8, temperature=params.temperature)
    for c in contestants:  # warm-up: first-call costs (allocation, thread start) stay out of the numbers
        _attempt(c, runs[c.key], prompts[0], engine.prompt_ids(prompts[0]), warm, log=log)
    for i, prompt in enumerate(prompts):
        ids = engine.prompt_ids(prompt)
        seeded = dataclasses.replace(params, seed=(params.seed or 0) + i)
        samples = {c.key: [] for c in contestants}
        order = rotation(contestants, i)
        for round_ in range(repeats):
            for c in order if round_ % 2 == 0 else order[::-1]:
                sample = _attempt(c, runs[c.key], prompt, ids, seeded, log=log)
                if sample is not None:
                    samples[c.key].append(sample)
        for c in contestants:
            if runs[c.key].error is None and samples[c.key]:
                runs[c.key].add(samples[c.key])
        line = "  ".join(f"{c.label} {runs[c.key].tokens_per_second[-1]:.1f}" for c in contestants
                         if runs[c.key].error is None)
        log(f"[{dataset} {contestants[0].precision} {i + 1}/{len(prompts)}] tok/s: {line}")
    return summarize(runs, params.greedy, dataset)


def _attempt(contestant, runs: SystemRuns, prompt, ids, params, log):
    """One generation (its Sample), or None where the contestant has failed (its row then says why)."""
    if runs.error is not None:
        return None
    try:
        return contestant.generate(prompt, ids, params)
    except SystemUnavailable as exc:  # another system failed mid-run: its row says so, the others go on
        runs.error = str(exc)
        log(f"{contestant.label}: {exc}")
        return None


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


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def summarize(runs: dict, greedy: bool, dataset: str) -> list[dict]:
    """One row per system: medians and ranges; speedups relative to specrt's plain decoding, prompt by prompt."""
    plain = runs[("specrt", "none")]
    rows = []
    for r in runs.values():
        row = {"system": r.system, "drafter": r.drafter, "precision": r.precision, "dataset": dataset,
               "prompts": len(r.tokens_per_second)}
        if r.system != "specrt":
            row["version"] = r.version
        else:
            row["batch_invariant"] = r.batch_invariant
        if r.error is not None:
            rows.append({**row, "error": r.error})
            continue
        ratios = [a / b for a, b in zip(r.tokens_per_second, plain.tokens_per_second) if b > 0]
        row.update({
            "tokens_per_second": statistics.median(r.tokens_per_second),
            "tokens_per_second_range": [min(r.tokens_per_second), max(r.tokens_per_second)],
            "tokens_per_second_by_prompt": [round(t, 3) for t in r.tokens_per_second],
            "mean_accepted": (r.produced / r.calls if r.calls else 0.0) if r.system == "specrt" or r.calls else None,
            # the verification width: drafts per target call, and those the target rejected
            "drafted_per_call": (sum(r.drafted) / r.calls if r.calls else 0.0) if r.system == "specrt" else None,
            "wasted_per_call": ((sum(r.drafted) - sum(r.accepted)) / r.calls if r.calls else 0.0)
            if r.system == "specrt" else ((r.drafted_total - r.accepted_total) / r.calls if r.calls else None),
            # the share of draft tokens accepted (another system's by its own count)
            "draft_acceptance": _share(sum(r.accepted), sum(r.drafted)) if r.system == "specrt"
            else _share(r.accepted_total, r.drafted_total),
            # vLLM's and SGLang's unit: 1 + accepted / drafts (steps that drafted nothing left out)
            "acceptance_length": 1.0 + sum(r.accepted) / r.drafted[0] if r.drafted and r.drafted[0] else None,
            "speedup": statistics.median(ratios) if ratios else 0.0,
            "min_speedup": min(ratios) if ratios else 0.0,
            "max_speedup": max(ratios) if ratios else 0.0,
            "acceptance_by_position": [round(a / n, 4) for a, n in zip(r.accepted, r.drafted) if n]})
        if r.system == "specrt" and r.drafter != "none":
            # what the adaptive loop chose: decode steps drafted by each member, and plain ones ("none")
            row["steps_by_drafter"] = dict(sorted(r.steps_by_drafter.items(), key=lambda kv: -kv[1]))
        if greedy:
            row["identical_to_plain"] = sum(a == b for a, b in zip(r.outputs, plain.outputs))
            # where an output first parts from plain decoding's (its length where it never does): the median
            row["first_difference"] = statistics.median(common_prefix(a, b) for a, b in zip(r.outputs, plain.outputs))
        rows.append(row)
    return rows
