"""The parts of the package import only what docs/architecture.md allows, the drafter registry is complete, and
no module but the registry branches on a drafter's name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from specrt import archs, drafter_kinds
from specrt.drafter_entry import FIELDS
from specrt.runtime.drafter import Drafter
from tests.architecture_rules import Import, imports, modules, violation, violations

ROOT = Path(__file__).resolve().parent.parent


def test_no_part_imports_what_it_may_not():
    assert violations(ROOT) == []


def test_the_walk_sees_every_part_and_lazy_imports():
    names = modules(ROOT)
    for module in ("specrt.runtime.engine", "specrt.runtime.drafter", "specrt.app.api", "specrt.app.serve.app",
                   "specrt.convert.pipeline", "specrt.drafters.dflash.drafter", "specrt.train.recipe",
                   "specrt.kernels.verify", "specrt.models.transformer", "specrt.cli", "specrt.drafter_kinds"):
        assert module in names
    found = imports(ROOT)
    # runtime/verify.py imports the Triton kernel inside a function only
    assert any(i.module == "specrt.runtime.verify" and i.target == "specrt.kernels.verify" and i.lazy for i in found)
    assert any(i.module == "specrt.runtime.engine" and i.target == "specrt.runtime.speculative" and not i.lazy
               for i in found)


@pytest.mark.parametrize("module, target, lazy, why", [
    ("specrt.runtime.engine", "specrt.convert.pipeline", True, "runtime imports convert"),
    ("specrt.runtime.engine", "specrt.models.gguf_loader", False, "runtime imports models"),
    ("specrt.runtime.engine", "specrt.app.api", True, "runtime imports app"),
    ("specrt.runtime.engine", "specrt.drafters.ngram", False, "runtime imports drafters"),
    ("specrt.runtime.engine", "torch", False, "at module level"),
    ("specrt.runtime.engine", "transformers", True, "runtime imports transformers"),
    ("specrt.drafters.feature_head", "specrt.runtime.engine", False, "beyond its drafter contract"),
    ("specrt.drafters.feature_head", "safetensors", True, "drafters imports safetensors"),
    ("specrt.bundle", "specrt.runtime.engine", True, "shared imports runtime"),
    ("specrt.convert.pipeline", "specrt.app.api", True, "convert imports app"),
    ("specrt.models.eagle3", "specrt.convert.quantize", True, "models imports convert"),
])
def test_forbidden_imports_are_caught(module, target, lazy, why):
    assert why in violation(Import(module, "x.py", 1, target, lazy))


@pytest.mark.parametrize("module, target, lazy", [
    ("specrt.runtime.verify", "torch", True),  # a GPU path
    ("specrt.drafters.feature_head", "specrt.runtime.drafter", False),
    ("specrt.app.api", "specrt.convert.pipeline", True),
    ("specrt.cli", "specrt.train.recipe", True),
    ("specrt.convert.pipeline", "specrt.runtime.target_session", False),
])
def test_allowed_imports_pass(module, target, lazy):
    assert violation(Import(module, "x.py", 1, target, lazy)) is None


@pytest.mark.parametrize("kind", list(drafter_kinds.KINDS.values()), ids=lambda k: k.name)
def test_every_registered_kind_is_complete(kind):
    cls = kind.build_class()
    assert issubclass(cls, Drafter)
    # a kind that runs from a graph in the bundle builds itself from its entry (the default builds from nothing)
    assert (cls.from_bundle.__func__ is not Drafter.from_bundle.__func__) == kind.needs_entry
    assert all(name in FIELDS for name in kind.entry_fields)
    assert isinstance(kind.auto, bool)
    if kind.exporter is not None:
        module = kind.exporter_module()
        for function, params in (("check", 2), ("stages", 1), ("hidden_layers_for", 2), ("add", 9)):
            # keyword-only parameters are one kind's own options (draft-model: draft_vocab)
            positional = [p for p in inspect.signature(getattr(module, function)).parameters.values()
                          if p.kind != inspect.Parameter.KEYWORD_ONLY]
            assert len(positional) == params, (kind.name, function)
    if kind.trainer is not None:
        assert callable(drafter_kinds.load_object(kind.trainer).check)


# chat roles that are also a drafter kind's name (Gemma 4's "assistant"): the chat and the server compare roles,
# which is not branching on a drafter; their modules are named here so that no other module may compare it
ROLE_MODULES = {"specrt.app.serve.requests", "specrt.datasets", "specrt.runtime.tool_formats",
                "specrt.runtime.harmony"}  # chat roles (harmony: a header addressed to=assistant)


def _compared(node, known) -> list[str]:
    """The names of `known` that one AST node compares against as string constants (`x == "eagle3"`,
    `x in ("eagle3", "mtp")`); none where the node is not a comparison."""
    found = []
    for side in [node.left, *node.comparators] if isinstance(node, ast.Compare) else []:
        values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        found += [v.value for v in values if isinstance(v, ast.Constant) and v.value in known]
    return found


def _kind_literals(node, module: str = "") -> list[str]:
    """Kind names written as string constants in a comparison (`x == "eagle3"`, `x in ("eagle3", "mtp")`)."""
    return [name for n in ast.walk(node) for name in _compared(n, drafter_kinds.KINDS)
            if not (name == "assistant" and module in ROLE_MODULES)]


def test_only_the_registry_branches_on_a_drafter_name():
    branching = {}
    for module, path in modules(ROOT).items():
        if module == "specrt.drafter_kinds":
            continue
        names = _kind_literals(ast.parse(path.read_text()), module)
        if names:
            branching[module] = names
    assert branching == {}


# tool-call formats named like the architecture whose templates write them (runtime/tool_formats.py's "gemma4"):
# a chat format's name, not an architecture's
TOOL_FORMAT_MODULES = {"specrt.runtime.tool_formats", "specrt.runtime.tool_detection", "specrt.runtime.gemma_values"}


def _arch_literals(node, module: str = "") -> list[str]:
    """Architecture names (archs.names()) in a comparison (`cfg.family == "gemma4"`, `t in ("qwen2", "mimo")`) or
    as every key of a dispatch table (`{"gemma3": ..., "gpt-oss": ...}`)."""
    known, found = archs.names(), []
    if module in TOOL_FORMAT_MODULES:
        return []
    for n in ast.walk(node):
        found += _compared(n, known)
        if isinstance(n, ast.Dict) and len(n.keys) > 1 and all(
                isinstance(k, ast.Constant) and k.value in known for k in n.keys):
            found += [k.value for k in n.keys]
    return found


def test_only_archs_branch_on_an_architecture_name():
    """Everything peculiar to an architecture lives in its module under specrt/archs/: elsewhere nothing compares
    against an architecture, model_type or GGUF architecture name. (The package only: scripts/ and tests/ write
    synthetic checkpoints of named architectures.)"""
    branching = {}
    for module, path in modules(ROOT).items():
        if module.startswith("specrt.archs"):
            continue
        names = _arch_literals(ast.parse(path.read_text()), module)
        if names:
            branching[module] = names
    assert branching == {}


@pytest.mark.parametrize("source, names", [
    ('if cfg.family == "gemma4": pass', ["gemma4"]),
    ('x = model_type in ("qwen2", "mimo")', ["qwen2", "mimo"]),
    ('t = {"gemma3": 1, "gpt-oss": 2}', ["gemma3", "gpt-oss"]),
    ('t = {"gemma3": 1, "other": 2}', []),  # not a dispatch over architectures
    ('hf = {**hf, "model_type": "llama"}', []),  # naming a config's type is not branching on one
])
def test_the_architecture_name_rule_sees_comparisons_and_tables(source, names):
    assert _arch_literals(ast.parse(source)) == names


@pytest.mark.parametrize("arch", list(archs.ARCHS.values()), ids=lambda a: a.name)
def test_every_registered_architecture_is_complete(arch):
    module = arch.module()
    assert callable(module.config_from_hf) and callable(module.torch_block)
    assert set(arch.gguf.values()) <= set(arch.hf_classes), "a GGUF architecture reads as a model_type it has"
    assert all(t in arch.hf_classes for t in arch.multimodal.values())
    for hook, params in (("gguf_config", 2), ("gguf_fixups", 4), ("gguf_undo", 4), ("gguf_refs", 3), ("hf_refs", 2),
                         ("gguf_split", 2), ("graph_qkv", 3), ("graph_layer_rest", 5), ("layer_shapes", 2),
                         ("check_weights", 3)):
        if hasattr(module, hook):
            assert len(inspect.signature(getattr(module, hook)).parameters) == params, (arch.name, hook)
