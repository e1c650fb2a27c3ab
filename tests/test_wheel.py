"""The source tree is the package: the wheel `pip wheel .` builds holds every module of specrt (setuptools finds the
packages under specrt/; a hand-kept list once left Gemma 4's assistant drafter out), and installed from that wheel,
not in editable mode, specrt imports every module, lists its catalog and converts and runs a tiny model.

The wheel is installed with `pip install --no-deps --target DIR` (its dependencies are this environment's) and run
with DIR first on the path, from a folder outside the source tree, so nothing of the checkout is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

IMPORT_ALL = r"""
import importlib, json, pathlib, sys
import specrt
root = pathlib.Path(specrt.__file__).parent
assert str(root).startswith(sys.argv[1]), f"specrt imported from {root}, not the installed wheel"
names = []
for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root.parent).with_suffix("")
    if "workers" in rel.parts:  # the compared systems' worker scripts run in those systems' environments
        continue
    names.append(".".join(p for p in rel.parts if p != "__init__"))
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"modules": len(names), "failed": failed}))
"""

RUN_TINY = r"""
import sys
import specrt
from specrt.cli import main
from specrt.runtime.sampling import SamplingParams
assert main(["convert", sys.argv[1], "-o", sys.argv[2], "--max-context", "64"]) == 0
engine = specrt.load(sys.argv[2], device="cpu")
result = engine.generate("hello", SamplingParams(max_new_tokens=4, temperature=0.0)).wait()
print(len(result.token_ids))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    tree = root / "tree"  # the tracked files alone: the build writes nothing into the checkout
    for name in tracked:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "-w", str(root / "dist"), str(tree)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (root / "dist").glob("specrt-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    tracked = [name for name in tracked if name.startswith("specrt/")]
    missing = [p for p in tracked if p.endswith((".py", ".c", ".h")) and p not in names]  # .c: specrt/kernels/ggml_ops
    assert not missing, f"the wheel lacks {missing[:5]}"
    assert "specrt/drafters/assistant/drafter.py" in names
    target = root / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
                           str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return target


def _run(target: Path, cwd: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_installed_wheel_imports_every_module(installed, tmp_path):
    done = _run(installed, tmp_path, IMPORT_ALL, str(installed))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["modules"] > 100 and report["failed"] == {}


def test_the_installed_wheel_lists_its_models_and_runs_a_tiny_one(installed, tmp_path):
    from tests.tiny_models import save_tiny_bundle_source

    listed = _run(installed, tmp_path, "from specrt.cli import run; run()", "models")
    assert listed.returncode == 0 and "smollm2-135m-instruct" in listed.stdout, listed.stderr[-1000:]
    source = save_tiny_bundle_source("llama", tmp_path / "src")
    done = _run(installed, tmp_path, RUN_TINY, str(source), str(tmp_path / "bundle"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip().splitlines()[-1]) == 4
