"""What `specrt bench` runs prompt by prompt: specrt itself (an engine and a drafter) or one variant of another
system in its worker process. Both answer generate(prompt, ids, params) with a Sample."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrt.app.api import DEFAULT_BATCH_INVARIANT
from specrt.app.compare.environment import SystemUnavailable, system_dir
from specrt.app.compare.worker_client import WorkerProcess


@dataclass
class Sample:
    token_ids: list[int]
    tokens_per_second: float  # decode phase
    stats: object = None  # specrt's GenerationStats; None for another system
    draft: tuple[int, int] | None = None  # another system's own count: (drafted, accepted) tokens


class SpecrtContestant:
    system = "specrt"

    def __init__(self, engine, drafter_name: str, drafter, precision: str, batch_invariant: bool | None):
        from specrt import __version__

        self.engine, self.drafter, self.drafter_obj, self.precision = engine, drafter_name, drafter, precision
        if batch_invariant is None:  # what specrt.load does
            batch_invariant = DEFAULT_BATCH_INVARIANT
        self.batch_invariant = batch_invariant
        # the drafters' records across this row's prompts (runtime/pays.py), as one user's engine would keep them;
        # rows keep their own, so that a row never starts a prompt from what another row learned on it
        self.records: dict = {}
        self.version = __version__
        self.key = ("specrt", drafter_name)
        self.label = drafter_name if drafter_name != "none" else "plain"

    def generate(self, prompt: str, ids: list[int], params) -> Sample:
        self.engine.reset()  # every system prefills the whole prompt: no prefix reuse across systems
        self.engine.batch_invariant = self.batch_invariant
        self.engine.pays.drafters = self.records
        result = self.engine.generate(prompt, params, drafter=self.drafter_obj).wait()
        return Sample(result.token_ids, result.stats.tokens_per_second, result.stats)


class WorkerContestant:
    def __init__(self, system: str, variant, worker: WorkerProcess, stop_ids):
        self.system, self.drafter, self.precision = system, variant.drafter, variant.precision
        self.worker, self.stop_ids, self.version = worker, stop_ids, worker.version
        self.key = (system, variant.drafter, variant.precision)  # a system may run one drafter at two precisions
        self.label = system + ("" if variant.drafter == "none" else f" {variant.drafter}")

    def generate(self, prompt: str, ids: list[int], params) -> Sample:
        out = self.worker.generate(ids, params.max_new_tokens, self.stop_ids)
        return Sample(out.token_ids, out.tokens_per_second, draft=out.draft)

    def close(self) -> None:
        self.worker.close()


def compare_context(manifest, bundle: Path, engine, threads: int, log, synth: dict | None = None):
    from specrt.app.compare.systems import CompareContext

    import os

    prov = manifest.provenance or {}
    from specrt.drafter_kinds import KINDS

    # the independent draft model, if the bundle has one: compared systems that take a draft model get its source
    draft = next((d for d in manifest.drafters if d.known and KINDS[d.kind].catalog_draft_model), None)
    source = Path(prov["source"]) if prov.get("source") else None
    draft_source = _model_source(Path(draft.source)) if draft is not None and draft.source else None
    draft_kind = "gguf" if draft_source is not None and draft_source.suffix == ".gguf" else "hf"

    return CompareContext(bundle=bundle, source=source, source_kind=prov.get("source_kind"),
                          source_sha256=prov.get("source_sha256"), draft_source=draft_source, draft_kind=draft_kind,
                          threads=threads or os.cpu_count() or 1, n_ctx=engine.max_context, log=log, synth=synth)


def _model_source(path: Path) -> Path | None:
    """A draft model's source as transformers reads it: a bundle copied in as the draft stands for the source it
    was converted from."""
    from specrt.bundle import MANIFEST, load_bundle
    from specrt.errors import SpecrtError

    if not (path / MANIFEST).is_file():
        return path
    try:
        src = (load_bundle(path, check_hashes=False).provenance or {}).get("source")
    except SpecrtError:
        return None
    return Path(src) if src else None


def start_external(compare, systems, pythons, install_errors, group, groups, manifest, bundle, engine, threads,
                   log, synth: dict | None = None) -> tuple[list[WorkerContestant], list[dict]]:
    """Workers for every compared system's variants in this precision group, and rows for those that failed.
    synth: {"lengths": [L, ...], "draft_tokens": K} where the run has synthetic-acceptance rows."""
    ctx = compare_context(manifest, bundle, engine, threads, log, synth)
    started, errors = [], []
    for name in compare:
        system = systems[name]
        if name in install_errors:
            errors.append(_error_row(name, group, f"not installed: {install_errors[name]}"))
            continue
        try:
            variants = system.variants(group, groups, ctx, pythons[name])
        except SystemUnavailable as exc:
            log(f"{name}: {exc}")
            errors.append(_error_row(name, group, str(exc)))
            continue
        for v in variants:
            log(f"starting {name} ({v.drafter}, {v.precision})")
            try:
                worker = WorkerProcess(pythons[name], system.script, v.config,
                                       system_dir(name) / "logs" / f"worker-{group}-{v.drafter}.log")
            except SystemUnavailable as exc:
                log(f"{name}: {exc}")
                errors.append(_error_row(name, v.precision, str(exc), v.drafter))
                continue
            started.append(WorkerContestant(name, v, worker, engine.stop_ids))
    return started, errors


def _error_row(system: str, precision: str, error: str, drafter: str = "none") -> dict:
    return {"system": system, "drafter": drafter, "precision": precision, "dataset": None, "error": error}
