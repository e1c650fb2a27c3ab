"""`specrt.load(model, device=..., drafter=...)`: a ready Engine from a bundle path or a catalog name.

A catalog name is converted into the cache on first use (`<cache>/bundles/<name>-<precision>`, or
`<name>-<precision>-draft` with the catalog's draft model when `drafter="draft-model"`), which needs the
`[convert]` extra; later loads open the cached bundle in seconds.
"""

from __future__ import annotations

from pathlib import Path

from specrt import drafter_kinds
from specrt.bundle import ATTENTION_ROWS_INPUT, MANIFEST, Manifest, checkpoint_sha256, load_bundle, weight_bits
from specrt.catalog import CATALOG, DEFAULT_MODEL, cache_dir, default_drafter_spec, lookup
from specrt.errors import SpecrtError
from specrt.runtime.engine import Engine
from specrt.runtime.harmony import REASONING_EFFORTS
from specrt.runtime.providers import profile_of, providers_for


def check_drafter_name(name: str) -> None:
    """A drafter name: a kind (specrt/drafter_kinds.py), KIND:tree / KIND:chain for kinds that draft trees,
    KIND:MODE for a mode the kind declares (dflash:prob, dflash:head), a mix "A+B" of different ones (the
    adaptive loop picks one per step), or "auto" (the bundle's drafters and ngram: auto_drafter)."""
    if "+" in name:
        members = drafter_kinds.members(name)
        if len(set(members)) != len(members) or any(m in ("", "none", "auto") for m in members):
            raise SpecrtError(f"drafter {name!r}: a mix names two or more different drafters, e.g. draft-model+ngram")
        for member in members:
            check_drafter_name(member)
        return
    if name in ("none", "auto"):
        return
    base, _, mode = name.partition(":")
    kind = drafter_kinds.kind(base)
    if mode and mode not in kind.modes and (not kind.trees or mode not in ("tree", "chain")):
        trees = f"only {', '.join(drafter_kinds.tree_kinds())} take :tree or :chain"
        if kind.modes:
            modes = f"{base} takes {' or '.join(':' + m for m in kind.modes)}"
            raise SpecrtError(f"drafter {name!r}: {modes}" + (f"; {trees}" if mode in ("tree", "chain") else ""))
        raise SpecrtError(f"drafter {name!r}: {trees}")


def make_drafter(name: str, bundle: Path, manifest: Manifest, providers, threads: int = 0):
    """The drafter object for a name such as "ngram", "eagle3", "eagle3:tree" or "auto" (None for "none")."""
    check_drafter_name(name)
    if name == "none":
        return None
    if name == "auto":
        name = auto_drafter(manifest)
    if "+" in name:
        from specrt.drafters.mixed import MixedDrafter

        return MixedDrafter([make_drafter(m, bundle, manifest, providers, threads)
                             for m in drafter_kinds.members(name)])
    base, _, mode = name.partition(":")
    if mode == "tree" and manifest.recurrent:
        raise SpecrtError(f"{name}: tree drafts need a target whose cache keeps any branch; this {manifest.architecture} "
                          f"target's linear-attention layers carry one recurrent state along one chain; use {base} "
                          f"(a chain)")
    if mode == "tree" and weight_bits(manifest.target.precision):
        raise SpecrtError(f"{name}: tree drafts on an {manifest.target.precision} graph are not exact (tree attention "
                          f"sums in another order, "
                          f"and int8 activations turn that rounding into different tokens); use {base} (a chain) "
                          f"or an fp32 bundle")
    kind = drafter_kinds.kind(base)
    entry = manifest.drafter(base)
    if kind.needs_entry and entry is None:
        raise SpecrtError(f"{bundle} has no {kind.title} ({kind.missing})")
    drafter = kind.build_class().from_bundle(bundle, entry, manifest, providers, threads=threads)
    if mode == "tree":
        drafter.use_tree()
        drafter.name = f"{base}:tree"
    elif mode in kind.modes:
        drafter.use_mode(mode)
        drafter.name = name
    return drafter


def _convert_catalog(model: str, bundle: Path, precision: str, drafter_spec, stages, device: str = "cpu") -> None:
    try:
        from specrt.convert.pipeline import ConvertOptions, convert
    except ImportError:
        raise SpecrtError(f"{model} is not converted yet and conversion needs: pip install 'specrt[convert]'") from None
    bundle.parent.mkdir(parents=True, exist_ok=True)
    convert(model, bundle, ConvertOptions(precision=precision, force=True, drafter=drafter_spec, device=device,
                                          int4_block_size=CATALOG[model].int4_block_size,
                                          draft_vocab=catalog_draft_vocab(model, drafter_spec)), stages)


def catalog_draft_vocab(model: str, drafter_spec) -> int:
    """The draft vocabulary a catalog model's own draft model is cut to (0: none, or not its own draft model)."""
    entry = CATALOG.get(model)
    if entry is None or not entry.draft_vocab:
        return 0
    own = f"draft-model:{entry.draft_model}" in drafter_kinds.spec_tuple(drafter_spec)
    return entry.draft_vocab if own else 0


def resolve_bundle(model: str, precision: str = "int4", stages=None, drafter: str | None = None,
                   device: str = "cpu") -> Path:
    """Path of a bundle for `model` (a bundle folder, or a catalog name converted on first use, for `device`: a GPU
    gets a bundle of the GPU profile, convert/gpu_profile.py)."""
    path = Path(model).expanduser()
    if path.is_dir() and (path / MANIFEST).is_file():
        return path
    if model not in CATALOG:
        if path.exists():
            raise SpecrtError(f"{path} is not a specrt bundle (make one with: specrt convert {path} -o BUNDLE)")
        lookup(model)  # raises the catalog's unknown-model error
    drafter_spec, suffix = default_drafter_spec(model), ""  # the catalog's own drafters, if any
    draft = CATALOG[model].draft_model
    if drafter_kinds.uses_catalog_draft_model(drafter) and f"draft-model:{draft}" not in (drafter_spec or ()):
        # a draft model the default bundle lacks: a bundle of its own
        if draft is None:
            raise SpecrtError(f"{model} has no draft model in the catalog (convert one in: specrt convert {model} "
                              f"--drafter draft-model:PATH_OR_NAME -o BUNDLE)")
        if draft == "self-int4" and precision == "int4":
            raise SpecrtError(f"{model}'s draft model is its own int4 graph, which drafts for the fp32 graph: "
                              f"add --precision fp32")
        drafter_spec, suffix = f"draft-model:{draft}", "-draft"
    profile = "" if device == "cpu" else f"-{device}"
    bundle = cache_dir() / "bundles" / f"{model}-{precision}{suffix}{profile}"
    if not (bundle / MANIFEST).is_file() or _stale(bundle, model, drafter_spec, device):
        _convert_catalog(model, bundle, precision, drafter_spec, stages, device)
    return bundle


def _stale(bundle: Path, model: str, spec, device: str = "cpu") -> bool:
    """A cached catalog bundle that must be converted again: unreadable, built with other shipped drafters or
    other int4 blocks than the catalog entry asks for now, for another device, or (a CPU bundle) before its graph
    could run attention on two rows (exact one-token calls without padding: convert/attention_rows.py) and
    call-invariantly (convert/exact_attention.py). One manifest read for every check."""
    try:
        manifest = load_bundle(bundle, check_hashes=False)
    except SpecrtError:
        return True
    if manifest.target.device != device:
        return True
    cpu_exact = device != "cpu" or (ATTENTION_ROWS_INPUT in manifest.target.inputs and manifest.target.exact_attention)
    return (_stale_head(manifest, spec) or _stale_blocks(manifest, model) or _stale_vocab(manifest, model, spec)
            or not cpu_exact)


def _stale_head(manifest: Manifest, spec) -> bool:
    """Converted before its catalog entry shipped these drafters (EAGLE-3 head, DFlash), or with older ones."""
    for kind, _, folder in (s.partition(":") for s in drafter_kinds.spec_tuple(spec)):
        if kind not in drafter_kinds.KINDS or not drafter_kinds.KINDS[kind].shipped:
            continue
        entry = manifest.drafter(kind)
        if entry is None or entry.source_sha256 != checkpoint_sha256(Path(folder)):
            return True
    return False


def _stale_vocab(manifest: Manifest, model: str, spec) -> bool:
    """A draft model cut to another draft vocabulary (or none) than the catalog entry asks for now."""
    own = f"draft-model:{CATALOG[model].draft_model}"
    entry = next((d for d in manifest.drafters if d.raw.get("spec") == own), None)
    return entry is not None and (entry.raw.get("draft_vocab") or {}).get("size", 0) != catalog_draft_vocab(model, spec)


def _stale_blocks(manifest: Manifest, model: str) -> bool:
    """An int4/int8 bundle quantized in other blocks than the catalog entry now asks for."""
    target = manifest.target
    return bool(weight_bits(target.precision)) and (target.int4_block_size or 32) != CATALOG[model].int4_block_size


def auto_drafter(manifest: Manifest) -> str:
    """The drafter `auto` means for a bundle: every drafter it holds, as chains, mixed with prompt lookup; the
    adaptive loop starts from the calibrated call costs and picks per step what pays (nothing when nothing does)."""
    return drafter_kinds.auto_choice(entry.kind for entry in manifest.drafters)


# Off: a verification call's logits are the target's own (lossless in distribution, as vLLM's and llama.cpp's
# speculation is), and a plain step stays a one-row call. On request (--batch-invariant) every call feeds >= 2 rows
# so that int4/int8 greedy output equals plain decoding bit for bit (docs/drafters.md, "Lossless").
DEFAULT_BATCH_INVARIANT = False


def load(model: str = DEFAULT_MODEL, device: str = "auto", drafter: str | None = None, precision: str = "int4",
         threads: int = 0, stages=None, batch_invariant: bool | None = None,
         draft_length: int | None = None, thinking: bool | None = None,
         reasoning_effort: str | None = None) -> Engine:
    """drafter: a name (a kind of specrt/drafter_kinds.py; eagle3/mtp also as NAME:tree), None or "none" for plain
    decoding, or "auto" (every drafter the bundle has, mixed with ngram: the adaptive loop picks one per step by
    measured speed, or none); "A+B" mixes drafters.
    batch_invariant: every target call feeds >= 2 rows, which makes int4/int8 output independent of how tokens
    are grouped into calls, so that greedy speculation equals plain decoding bit for bit (fp32 needs no such
    thing); plain steps then cost more (docs/performance.md, "Losslessness and batch-invariant calls"). None: off
    (each emitted token is still the target's own verified choice).
    draft_length: draft exactly this many tokens per target call (adaptive length and the confidence cut off), as
    vLLM and SGLang draft a fixed num_speculative_tokens; None: the adaptive controller chooses.
    thinking: reasoning models' thinking on (True) or off (False) through the chat template's enable_thinking
    (Qwen3, Qwen3.5); None: the template's default.
    reasoning_effort: "low", "medium" or "high" through the chat template's reasoning_effort (gpt-oss); None: the
    template's default."""
    if reasoning_effort not in (None, *REASONING_EFFORTS):
        raise SpecrtError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, not {reasoning_effort!r}")
    if drafter is not None:
        check_drafter_name(drafter)
    providers = providers_for(device)
    bundle = resolve_bundle(model, precision, stages, drafter, profile_of(providers))
    manifest = load_bundle(bundle, check_hashes=False)  # sizes on every load; `specrt info` checks sha256
    drafter_obj = make_drafter(drafter or "none", bundle, manifest, providers, threads)
    check_draft_length(draft_length, drafter_obj, manifest)
    if batch_invariant is None:
        batch_invariant = DEFAULT_BATCH_INVARIANT
    engine = Engine(bundle, manifest, providers, threads=threads, drafter=drafter_obj, batch_invariant=batch_invariant,
                    draft_length=draft_length)
    engine.thinking, engine.reasoning_effort = thinking, reasoning_effort
    return engine


def check_draft_length(draft_length: int | None, drafter, manifest: Manifest | None = None) -> None:
    """A fixed draft length must be positive, needs a drafter, fits a block drafter's block and what a recurrent
    target can replay of one call."""
    if draft_length is None:
        return
    if draft_length < 1:
        raise SpecrtError(f"--draft-length must be at least 1 (got {draft_length})")
    if manifest is not None and manifest.states is not None and draft_length > manifest.states.capacity - 1:
        raise SpecrtError(f"--draft-length {draft_length}: this {manifest.architecture} target keeps the recurrent "
                          f"state of at most {manifest.states.capacity} tokens of a call (its linear-attention layers "
                          f"capture that many transitions), so it verifies at most {manifest.states.capacity - 1} "
                          f"draft tokens")
    if drafter is None:
        raise SpecrtError("--draft-length fixes how many tokens a drafter drafts, but no drafter is used "
                          "(--drafter none, or the bundle has none)")
    for member in drafter.members:
        limit = member.max_draft if member.block_drafter else None
        if limit is not None and draft_length > limit:
            raise SpecrtError(f"--draft-length {draft_length}: the {member.name} drafter drafts at most {limit} "
                              f"tokens per call (its block size - 1)")
