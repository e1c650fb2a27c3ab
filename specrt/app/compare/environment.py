"""Isolated environments for the systems `specrt bench --compare` measures against.

Each system gets its own virtual environment in the cache (SPECRT_CACHE/systems/NAME/venv), layered over the
running Python's packages (a .pth file lists specrt's site-packages behind the environment's own) so that torch
and transformers are not fetched again, while whatever the system installs (its own onnxruntime, another
transformers) stays inside it and never changes specrt's environment. (venv's --system-site-packages would
expose the base interpreter's packages, not those of the virtual environment specrt itself runs in.) Installed
on first use, reused afterwards: a marker file records what the environment holds, and it is written only after
pip succeeded.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

from specrt.catalog import cache_dir
from specrt.errors import SpecrtError


class SystemUnavailable(SpecrtError):
    """A compared system could not be installed, prepared or run; its rows say so."""


def system_dir(name: str) -> Path:
    return cache_dir() / "systems" / name


def ensure_environment(name: str, requirements: tuple[str, ...], log, layered: bool = True,
                       remove: tuple[str, ...] = (), build_env: dict[str, str] | None = None) -> Path:
    """The Python of NAME's environment, with requirements installed (pip output in NAME/install.log).
    layered=False: a plain environment that sees none of specrt's packages (a system that pins its own torch
    stack); remove: packages uninstalled after the install (what a system pulls in but cannot import); build_env:
    environment variables for pip's builds (a package compiled from source), recorded with what was installed, so
    that other settings install again."""
    root = system_dir(name)
    python = root / "venv" / "bin" / "python"
    marker = root / "installed.json"
    want = (sorted(requirements) + [f"-{r}" for r in sorted(remove)] + ([] if layered else ["(not layered)"])
            + [f"{k}={v}" for k, v in sorted((build_env or {}).items())])
    if python.is_file() and marker.is_file() and json.loads(marker.read_text()).get("requirements") == want:
        if layered:  # specrt may run from another environment than the one this was first layered over
            _layer_over_running_python(python)
        return python
    if build_env and python.is_file():  # built with other settings: a fresh environment, nothing kept
        shutil.rmtree(root / "venv")
    root.mkdir(parents=True, exist_ok=True)
    log(f"installing {name} ({' '.join(want) or 'nothing extra'}) into {root / 'venv'} (first use only)")
    t0 = time.perf_counter()
    if not python.is_file():
        proc = subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemUnavailable(f"could not create an environment for {name}: {_last_line(proc.stderr)}")
        if layered:
            _layer_over_running_python(python)
    if requirements:
        with open(root / "install.log", "w") as logf:
            proc = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                                   *(["--no-cache-dir"] if build_env else []),  # no wheel built with other flags
                                   *sorted(requirements)], stdout=logf, stderr=subprocess.STDOUT,
                                  env={**os.environ, **(build_env or {})})
            if proc.returncode == 0 and remove:
                proc = subprocess.run([str(python), "-m", "pip", "uninstall", "-y", *remove],
                                      stdout=logf, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            text = (root / "install.log").read_text(errors="replace")
            raise SystemUnavailable(f"could not install {' '.join(sorted(requirements))}: "
                                    f"{_last_line(text, 'ERROR')} (log: {root / 'install.log'})")
    marker.write_text(json.dumps({"requirements": want, "seconds": round(time.perf_counter() - t0, 1)}))
    log(f"{name} installed in {time.perf_counter() - t0:.0f} s")
    return python


def _layer_over_running_python(python: Path) -> None:
    """Put the running Python's site-packages folders behind those of the environment at python (rewritten when
    they changed)."""
    proc = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemUnavailable(f"could not read the new environment's site-packages: {_last_line(proc.stderr)}")
    pth = Path(proc.stdout.strip()) / "_specrt_parent.pth"
    text = "".join(f"{p}\n" for p in site.getsitepackages())
    if not pth.is_file() or pth.read_text() != text:
        pth.write_text(text)


def _last_line(text: str, prefer: str = "") -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    preferred = [line for line in lines if prefer and line.startswith(prefer)]
    return (preferred or lines or ["no output"])[-1]
