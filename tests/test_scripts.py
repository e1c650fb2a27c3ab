"""Every script in scripts/ still runs: each answers --help (exit 0, some output) without doing its work. The list
is the folder itself (Python scripts with this interpreter, shell scripts with bash), so a new script is checked
as soon as it is added; scripts/ keeps only the tools the docs and tests use (docs/adding-an-architecture.md, "The source tree")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "scripts").rglob("*")
                 if p.suffix in (".py", ".sh") and p.is_file() and "__pycache__" not in p.parts)


def test_the_folder_has_scripts():
    assert SCRIPTS, "scripts/ is empty or missing"


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT / "scripts")) for p in SCRIPTS])
def test_script_answers_help(script: Path):
    runner = [sys.executable] if script.suffix == ".py" else ["bash"]
    proc = subprocess.run([*runner, str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{script.name} --help: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert proc.stdout.strip(), f"{script.name} --help printed nothing"
