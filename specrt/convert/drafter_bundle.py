"""`specrt convert SOURCE --drafter KIND:ARG`: put a drafter's graph into the bundle beside the target.

The kinds and what ARG each takes come from the registry (specrt/drafter_kinds.py); each kind's exporter module
does the work through four functions: `check(arg, precision)` refuses a bad spec before any work, `stages(arg)`
counts its progress stages, `hidden_layers_for(arg, loaded)` names the target layers it reads (asked before the
target graph is built, so a drafter that does not fit the target fails early) and `add(...)` writes its graph into
the bundle and returns its manifest entry (specrt/drafter_entry.py). Exporters: convert/eagle3_bundle.py,
mtp_bundle.py, dflash_bundle.py, draft_model_bundle.py.
"""

from __future__ import annotations

from pathlib import Path

from specrt import drafter_kinds
from specrt.errors import SpecrtError


def _usage() -> str:
    return ", ".join(f"{k.name}:{k.convert_arg}".replace(":[", "[:") for k in drafter_kinds.KINDS.values()
                     if k.exporter)


def drafter_specs(spec) -> tuple[str, ...]:
    """--drafter given once (a string), several times (a tuple) or not at all (None): a tuple of specs, one per
    kind (a bundle holds at most one drafter of each kind)."""
    specs = drafter_kinds.spec_tuple(spec)
    kinds = [parse_drafter_spec(s)[0] for s in specs]
    twice = next((k for k in kinds if kinds.count(k) > 1), None)
    if twice:
        raise SpecrtError(f"--drafter {twice} given twice: a bundle holds one drafter of each kind")
    return specs


def parse_drafter_spec(spec: str) -> tuple[str, str]:
    name, _, arg = spec.partition(":")
    kind = drafter_kinds.KINDS.get(name)
    if kind is None:
        raise SpecrtError(f"unknown drafter kind {name!r} in --drafter {spec!r} (expected {_usage()})")
    if kind.exporter is None:
        raise SpecrtError(f"the {name} drafter needs no conversion: pass --drafter {name} when you run the bundle")
    if not arg and not kind.convert_arg.startswith("["):
        raise SpecrtError(f"--drafter {spec!r} names no model or checkpoint ({name}:{kind.convert_arg})")
    return name, arg


def _exporter(spec: str):
    name, arg = parse_drafter_spec(spec)
    return drafter_kinds.KINDS[name].exporter_module(), arg


def check_drafter_spec(spec: str, precision: str) -> None:
    """Refuse a bad --drafter before any work is done."""
    name, arg = parse_drafter_spec(spec)
    if "FOLDER" in drafter_kinds.KINDS[name].convert_arg and arg and not Path(arg).expanduser().is_dir():
        raise SpecrtError(f"{name}:{arg}: no such checkpoint folder")
    module, arg = _exporter(spec)
    module.check(arg, precision)


def drafter_stages(spec: str | None) -> int:
    """How many progress stages adding this drafter takes."""
    if not spec:
        return 0
    module, arg = _exporter(spec)
    return module.stages(arg)


def hidden_layers_for(spec: str | None, loaded) -> tuple[int, ...]:
    """Target layers whose hidden states the drafter reads (EAGLE-3: its three aux layers; MTP: the last)."""
    if not spec:
        return ()
    module, arg = _exporter(spec)
    return tuple(module.hidden_layers_for(arg, loaded))


def add_drafter(spec: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages, build_graph,
                draft_vocab: int = 0, device: str = "cpu") -> dict:
    """Write the drafter's graph into tmp; returns its manifest entry. draft_vocab: its output head cut to that
    many tokens, for the kinds whose exporter takes it (a draft model); device: the profile its graph is built in
    (convert/gpu_profile.py), the target's."""
    module, arg = _exporter(spec)
    extra = {"draft_vocab": draft_vocab} if draft_vocab and takes_draft_vocab(spec) else {}
    return module.add(spec, arg, tmp, loaded, precision, max_context, providers, stages, build_graph, device=device,
                      **extra)


def _takes(spec: str, option: str) -> bool:
    """Whether this drafter's exporter takes a keyword-only option of its add (draft_vocab)."""
    import inspect

    module, _ = _exporter(spec)
    return option in inspect.signature(module.add).parameters


def takes_draft_vocab(spec: str) -> bool:
    """Whether this drafter's exporter cuts its head to a draft vocabulary."""
    return _takes(spec, "draft_vocab")
