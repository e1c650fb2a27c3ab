"""specrt's own CPU operators for ONNX Runtime: GGUF matrix products on the file's own blocks.

ONNX Runtime's MatMulNBits takes 2, 4 or 8 bits with a float32 scale per block and no minimum: carried exactly, a Q4_K
weight became 4-bit values with a float32 scale, a zero point and a float32 minimum per 32 (about 6.1 bits a weight
against the file's 4.5), Q5_K 8-bit values with the same (10 against 5.5), Q6_K 8-bit values with a float32 scale per
16 (10 against 6.6), Q5_0 8-bit values (9.1 against 5.5). Decoding reads every weight once a token, so those bytes
were the speed. The operators here (domain `specrt.ggml`: MatMulQ5_0, MatMulQ5_1, MatMulQ4_K, MatMulQ5_K, MatMulQ6_K,
GatherQ5_0 ... GatherQ6_K for embedding tables, and MoE for a layer's experts; ggml_kernels.c, ggml_moe.c, ort_ops.c)
multiply by the GGUF tensor's own bytes, the activations quantized to 8 bits per 32 as MatMulNBits' int8 path does
(accuracy_level 0: float activations, for conversion's exact check). The bundle holds the bytes with the weight rows
interleaved by 8 (layout.py, as llama.cpp repacks for its CPU kernels): one broadcast activation meets eight rows'
weights in a vector, so a call of several tokens unpacks each block once for all of them.

The library is compiled from the C sources beside this file on first use (`cc -O3 -march=native`: the machine's own
vector instructions; an AVX2 path using AVX-512 VNNI's dot product where the CPU has it, plain C without AVX2) into the
cache (~/.cache/specrt/ggml_ops/<key>/, the key covering the sources, the compiler and the CPU's flags), as
llama-cpp-python builds llama.cpp at install; written atomically. Without a C compiler it is unavailable: conversion
keeps the MatMulNBits forms, and a bundle that uses the operators says in one line what is missing. SPECRT_GGML_OPS=0
turns it off (conversion then writes the MatMulNBits forms)."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from specrt.errors import BundleError

DOMAIN = "specrt.ggml"
# GGUF type -> operator. Q4_0 and Q4_1 stay in MatMulNBits: their form there reads 1.14x / 1.22x the file's bytes,
# and on the default model (Q4_1, 135M) MatMulNBits decoded faster (docs/performance.md)
OPS = {t: f"MatMul{t}" for t in ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")}
GATHERS = {t: f"Gather{t}" for t in OPS}  # an embedding table's rows from the same blocks (a tied lm_head's too)
TYPE_NUMBERS = {"Q5_0": 6, "Q5_1": 7, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}  # ggml's, as the MoE operator's attributes
SOURCES = ("ggml_kernels.c", "ggml_moe.c", "ort_ops.c", "ggml_kernels.h", "ggml_moe.h")
LIBRARY = "libspecrt_ggml.so"
BUILD_SECONDS = 180


class NativeUnavailable(RuntimeError):
    """The operators cannot be built or loaded here (the reason is the message)."""


def enabled() -> bool:
    """The operators are wanted (SPECRT_GGML_OPS is not 0) and can be built on this machine."""
    if os.environ.get("SPECRT_GGML_OPS", "1") == "0":
        return False
    try:
        library()
        return True
    except NativeUnavailable:
        return False


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise NativeUnavailable("no C compiler (cc, gcc or clang) to build specrt's GGUF operators")


def _flags(cc: str) -> list[str]:
    """-march=native where the compiler takes it (x86 and most ARM compilers do)."""
    base = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-std=c11"]
    probe = subprocess.run([cc, "-march=native", "-x", "c", "-E", "-o", os.devnull, "-"], input=b"",
                           capture_output=True, timeout=30)
    return base + (["-march=native"] if probe.returncode == 0 else [])


@lru_cache(maxsize=1)
def library() -> Path:
    """The compiled operator library, built into the cache on first use; NativeUnavailable says why not."""
    from specrt.catalog import cache_dir

    if os.environ.get("SPECRT_GGML_OPS", "1") == "0":
        raise NativeUnavailable("SPECRT_GGML_OPS=0 turns specrt's GGUF operators off")
    cc = _compiler()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
        flags = _flags(cc)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeUnavailable(f"the C compiler {cc} does not run ({exc})") from None
    here = Path(__file__).parent
    key = hashlib.sha256()
    for name in SOURCES:
        key.update((here / name).read_bytes())
    key.update(version + " ".join(flags).encode() + _cpu_flags().encode())
    out = cache_dir() / "ggml_ops" / key.hexdigest()[:16] / LIBRARY
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / LIBRARY
        cmd = [cc, *flags, "-o", str(built), *(str(here / n) for n in SOURCES if n.endswith(".c")), "-lm"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_SECONDS)
        except (OSError, subprocess.SubprocessError) as exc:
            raise NativeUnavailable(f"building specrt's GGUF operators failed ({exc})") from None
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise NativeUnavailable(f"building specrt's GGUF operators failed: {first[:200]}")
        os.replace(built, out)  # atomic: a process beside this one sees the whole library or none
    return out


def register(options) -> None:
    """Make the operators known to an onnxruntime.SessionOptions; BundleError (one line) where they cannot be."""
    try:
        path = library()
    except NativeUnavailable as exc:
        raise BundleError(f"this bundle runs GGUF weights in specrt's own operators, which are unavailable: {exc}; "
                          f"convert it again here (without them it uses ONNX Runtime's)") from None
    options.register_custom_ops_library(str(path))


def graph_uses(model_path) -> bool:
    """Whether an ONNX graph file (weights kept outside it) has a node of DOMAIN."""
    try:
        with open(model_path, "rb") as f:
            return DOMAIN.encode() in f.read()
    except OSError:
        return False
