"""The package's parts and the imports each may make (docs/architecture.md), checked by reading the source.

Every import statement of every module is read with `ast`, at module level and inside functions alike, and
classified by the part it comes from and the part (or third-party package) it names. `python -m
tests.architecture_rules [ROOT]` prints lines per part and every forbidden import of a checkout.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# top-level modules of specrt/ that form the shared layer: the bundle schema, the drafter registry, errors, the
# catalog of models and the benchmark datasets (standard library and numpy only)
SHARED = {"specrt.bundle", "specrt.errors", "specrt.tensor_file", "specrt.drafter_entry", "specrt.drafter_kinds",
          "specrt.catalog", "specrt.datasets", "specrt.dflash_io", "specrt.archs"}
ENTRY = {"specrt", "specrt.cli"}  # the package facade (specrt.load) and the command line: may import every part

# part -> the parts of specrt it may import (itself included)
ALLOWED = {
    "shared": {"shared"},
    "kernels": {"shared", "kernels"},
    "runtime": {"shared", "kernels", "runtime"},
    "drafters": {"shared", "drafters", "runtime"},
    "models": {"shared", "models"},
    "convert": {"shared", "models", "kernels", "runtime", "convert"},
    # one module per architecture (specrt/archs/): its config, layouts, torch block and graph hooks over the
    # building blocks of models/ and convert/ (those it imports inside its hooks)
    "archs": {"shared", "models", "convert", "archs"},
    "train": {"shared", "models", "kernels", "runtime", "convert", "train"},
    "app": {"shared", "kernels", "runtime", "drafters", "models", "convert", "train", "app"},
    "entry": {"shared", "kernels", "runtime", "drafters", "models", "convert", "train", "app", "entry"},
}
# what drafters may use of the runtime: the contract and two building blocks (runtime/drafter.py says why)
DRAFTER_RUNTIME = {"specrt.runtime.drafter", "specrt.runtime.sampling", "specrt.runtime.target_session"}
CONVERSION_PACKAGES = {"transformers", "onnx", "gguf", "safetensors", "sentencepiece", "accelerate"}
GPU_PACKAGES = {"torch", "triton"}
# part -> third-party packages it may not import anywhere / only inside functions (a lazy GPU path)
FORBIDDEN_PACKAGES = {
    "shared": CONVERSION_PACKAGES | GPU_PACKAGES | {"onnxruntime"},
    "runtime": CONVERSION_PACKAGES,
    "drafters": CONVERSION_PACKAGES,
    "kernels": CONVERSION_PACKAGES,
}
LAZY_ONLY = {"runtime": GPU_PACKAGES, "drafters": GPU_PACKAGES}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. specrt.runtime.engine
    path: str  # its file, relative to the root
    line: int
    target: str  # the imported module, e.g. specrt.convert.pipeline or torch
    lazy: bool  # inside a function


def package_dirs(root: Path) -> dict[str, str]:
    """Package name -> folder: the one package, `specrt/`, where the source tree is the package."""
    return {"specrt": "specrt"}


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file of every module of the installed package (compare workers excluded: they run in other
    systems' environments, not in specrt's)."""
    found = {}
    for package, folder in package_dirs(root).items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            if "workers" in rel.parts:
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if name not in found:
                found[name] = path
    return found


def part_of(module: str) -> str:
    if module in ENTRY:
        return "entry"
    if module in SHARED:
        return "shared"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "specrt" else "external"


def imports(root: Path) -> list[Import]:
    found = []
    for module, path in modules(root).items():
        tree = ast.parse(path.read_text(), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found += _imports_of(tree, module, package, str(path.relative_to(root)))
    return found


def _imports_of(tree: ast.AST, module: str, package: str, path: str) -> list[Import]:
    out = []

    def visit(node, lazy: bool):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Import(module, path, child.lineno, a.name, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against the package
                    up = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # "from specrt import drafter_kinds" names a module, "from specrt import __version__" the package;
                # "from x import name" names x
                targets = [f"{base}.{a.name}" if base == "specrt" and not a.name.startswith("__") else base
                           for a in child.names]
                out.extend(Import(module, path, child.lineno, t, lazy) for t in dict.fromkeys(targets))
            if not _type_checking_block(child):
                visit(child, inner)

    visit(tree, False)
    return out


def _type_checking_block(node) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def violation(imp: Import) -> str | None:
    """Why this import is forbidden, or None."""
    source = part_of(imp.module)
    top = imp.target.split(".")[0]
    if imp.target == "specrt":  # the package itself (its version): its module-level code imports no part
        return None
    if top == "specrt":
        target = part_of(imp.target)
        if target not in ALLOWED.get(source, set()):
            return f"{source} imports {target} ({imp.target})"
        if source == "drafters" and target == "runtime" and imp.target not in DRAFTER_RUNTIME:
            return f"drafters import runtime beyond its drafter contract ({imp.target})"
        return None
    if top in FORBIDDEN_PACKAGES.get(source, set()):
        return f"{source} imports {top}"
    if top in LAZY_ONLY.get(source, set()) and not imp.lazy:
        return f"{source} imports {top} at module level (only a GPU path may, inside a function)"
    return None


def violations(root: Path) -> list[str]:
    return [f"{imp.path}:{imp.line}: {why}" for imp in imports(root) if (why := violation(imp))]


def lines_per_part(root: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for module, path in modules(root).items():
        part = part_of(module)
        counts[part] = counts.get(part, 0) + len(path.read_text().splitlines())
    return counts


if __name__ == "__main__":
    where = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    print("lines per part:", dict(sorted(lines_per_part(where).items())))
    found = violations(where)
    print(f"{len(found)} forbidden imports")
    for v in found:
        print(" ", v)
