"""`specrt` CLI as a runtime-only install runs it: the conversion side's packages (torch, transformers,
safetensors, onnx, gguf) cannot be imported. Usage: python tests/runtime_only_cli.py ARGS... (the CLI's own), or
--try-import MODULE (prints whether MODULE imports)."""

from __future__ import annotations

import importlib
import importlib.abc
import sys

BLOCKED = frozenset({"torch", "transformers", "safetensors", "onnx", "gguf"})


class BlockConversionPackages(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: a runtime-only install)", name=name)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, BlockConversionPackages())
    if sys.argv[1:2] == ["--try-import"]:
        try:
            importlib.import_module(sys.argv[2])
            print("imported")
        except ModuleNotFoundError:
            print("blocked")
    else:
        from specrt.cli import run

        sys.argv[0] = "specrt"
        run()
