"""The one registry of drafter kinds: for each kind name, how convert puts it into a bundle, how the runtime
builds its proposer, what its manifest entry carries, whether it drafts trees and what `auto` makes of it.

Nothing else branches on a drafter's name. The registry imports only the standard library; the parts it names
are given as import paths and imported when used, so that the runtime side never imports convert/ and the
bundle schema never imports either. Adding a kind: a proposer (drafters/, a runtime.drafter.Drafter subclass with
`from_bundle`), an exporter module in convert/ (check, stages, hidden_layers_for, add) and one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from specrt.errors import SpecrtError


@dataclass(frozen=True)
class DrafterKind:
    name: str
    proposer: str  # "module:Class": its Drafter, built with Class.from_bundle(bundle_dir, entry, manifest, ...)
    exporter: str | None  # module of convert/ that adds it to a bundle; None: it needs no conversion
    convert_arg: str = ""  # what --drafter KIND:ARG takes: "FOLDER", "[FOLDER]" (may be left out), "PATH_OR_NAME"
    entry_fields: tuple[str, ...] = ()  # fields its manifest entry must carry (types: specrt/drafter_entry.py)
    head_graph: bool = True  # its graph records its own hidden width (graph.hidden_size)
    trees: bool = False  # drafts EAGLE-2 dynamic trees as KIND:tree
    modes: tuple[str, ...] = ()  # other KIND:MODE names it takes (its proposer's use_mode(MODE))
    auto_modes: tuple[str, ...] = ()  # KIND:MODE members `auto` adds beside KIND (ngram:pool)
    auto: bool = True  # `auto` mixes it in when a bundle has it (as a chain; prompt lookup always joins)
    shipped: bool = False  # the catalog may ship a checkpoint of it in the package (drafters/<module>/heads/)
    catalog_draft_model: bool = False  # it runs the catalog's draft model (which may need a bundle of its own)
    trainer: str | None = None  # "module:object" of train/ that `specrt train-drafter --kind NAME` runs
    title: str = ""  # what a user calls one ("EAGLE-3 head")
    missing: str = ""  # how to give a bundle one, for the error when it has none
    engine_writer: str | None = None  # "module:function" of convert/export_drafter.py writing it for vLLM/SGLang
    checkpoint_names: tuple[str, ...] = ()  # lower-case words that name its checkpoints (architecture, format)
    not_exported: str = ""  # why `specrt export-drafter` has nothing to write for it

    @property
    def needs_entry(self) -> bool:
        """Runs from a graph in the bundle (else it is built from nothing, like prompt lookup)."""
        return self.exporter is not None

    def build_class(self):
        """The proposer class (imports the drafter's module)."""
        return load_object(self.proposer)

    def exporter_module(self):
        """convert/'s module for this kind (imports convert/: needs the [convert] extra)."""
        return importlib.import_module(self.exporter)


FEATURE_HEAD_FIELDS = ("draft_vocab_size", "target_hidden_size", "aux_layers")

KINDS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("eagle3", "specrt.drafters.eagle3:Eagle3Drafter", "specrt.convert.eagle3_bundle", "FOLDER",
                FEATURE_HEAD_FIELDS, trees=True, shipped=True, trainer="specrt.train.recipe:EAGLE3",
                title="EAGLE-3 head", missing="convert it with --drafter eagle3:CHECKPOINT_FOLDER",
                engine_writer="specrt.convert.export_drafter:write_eagle3", checkpoint_names=("eagle3",)),
    DrafterKind("mtp", "specrt.drafters.mtp:MtpDrafter", "specrt.convert.mtp_bundle", "[FOLDER]",
                FEATURE_HEAD_FIELDS, trees=True, trainer="specrt.train.recipe:MTP",
                title="MTP module", missing="convert a target that ships one with --drafter mtp",
                not_exported="MTP modules are part of the target's own checkpoint: the engines read them from there"),
    DrafterKind("dflash", "specrt.drafters.dflash:DFlashDrafter", "specrt.convert.dflash_bundle", "FOLDER",
                ("block_size", "mask_token_id", "target_hidden_size", "vocab_size", "target_layer_ids"),
                modes=("prob", "head"), shipped=True, trainer="specrt.train.recipe:DFLASH",
                title="DFlash drafter", missing="convert it with --drafter dflash:CHECKPOINT_FOLDER",
                engine_writer="specrt.convert.export_drafter:write_dflash", checkpoint_names=("dflash",)),
    DrafterKind("draft-model", "specrt.drafters.draft_model:DraftModelDrafter", "specrt.convert.draft_model_bundle",
                "PATH_OR_NAME", ("vocab_size", "model_config"), head_graph=False, catalog_draft_model=True, title="draft model",
                missing="convert it with --drafter draft-model:PATH_OR_NAME",
                not_exported="a draft model is an ordinary model folder: give the engine its source as it is"),
    DrafterKind("assistant", "specrt.drafters.assistant:AssistantDrafter", "specrt.convert.assistant_bundle",
                "FOLDER", ("vocab_size", "target_hidden_size", "target_layer_ids"), title="Gemma 4 assistant",
                missing="convert a Gemma 4 target with --drafter assistant:CHECKPOINT_FOLDER",
                checkpoint_names=("gemma4_assistant",),
                not_exported="the engines load Gemma 4's assistant checkpoint as it is (transformers: "
                             "Gemma4AssistantForCausalLM as assistant_model; llama.cpp: its assistant GGUF)"),
    DrafterKind("ngram", "specrt.drafters.ngram:NgramDrafter", None, title="prompt lookup",
                modes=("history", "pool"), auto_modes=("pool",),
                not_exported="the engines have their own prompt lookup (vLLM: method \"ngram\"; SGLang: "
                             "speculative_algorithm \"NGRAM\"): nothing to export"),
)}


def spec_tuple(spec) -> tuple[str, ...]:
    """Drafter specs (KIND:ARG) given once (a string), several times (a sequence) or not at all (None or empty):
    always a tuple."""
    return () if not spec else (spec,) if isinstance(spec, str) else tuple(spec)


def load_object(ref: str):
    """The object a "module:attribute" path names."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


def kind(name: str) -> DrafterKind:
    """The kind of a drafter name ("eagle3", "eagle3:tree"); SpecrtError for an unknown one."""
    base = name.partition(":")[0]
    if base not in KINDS:
        raise SpecrtError(f"drafter {base!r} is unknown (available: none, {', '.join(KINDS)}, auto; "
                          f"{' and '.join(tree_kinds())} also as NAME:tree)")
    return KINDS[base]


def exportable_kinds() -> tuple[str, ...]:
    """Kinds `specrt export-drafter` writes for the serving engines."""
    return tuple(k.name for k in KINDS.values() if k.engine_writer)


def trainable_kinds() -> tuple[str, ...]:
    return tuple(k.name for k in KINDS.values() if k.trainer)


def tree_kinds() -> tuple[str, ...]:
    return tuple(k.name for k in KINDS.values() if k.trees)


def members(name: str) -> list[str]:
    """The drafters a name runs: "draft-model+ngram" -> ["draft-model", "ngram"]."""
    return name.split("+")


def uses_catalog_draft_model(name: str | None) -> bool:
    """Whether a drafter name (a mix included) runs the catalog's draft model."""
    return bool(name) and any(m.partition(":")[0] in KINDS and KINDS[m.partition(":")[0]].catalog_draft_model
                              for m in members(name))


def auto_choice(present_kinds) -> str:
    """What `auto` runs for a bundle holding drafters of these kinds: a mix of every one of them (registry order, as
    chains), prompt lookup and the n-gram pool of earlier conversations, among which the adaptive loop picks per
    step by measured tokens per second, drafting nothing where none pays (runtime/adaptive.py)."""
    present = set(present_kinds)
    chosen = [k.name for k in KINDS.values() if k.auto and k.needs_entry and k.name in present]
    free = [name for k in KINDS.values() if k.auto and not k.needs_entry
            for name in (k.name, *(f"{k.name}:{m}" for m in k.auto_modes))]
    return "+".join([*chosen, *free])
