"""The compared systems' workers: a worker killed by a signal is reported with the signal and what it means, and
llama.cpp is built without AMX where the CPU advertises it (a native build traps there when AMX is not granted)."""

from __future__ import annotations

import sys

import pytest

from specrt.app.compare.environment import SystemUnavailable
from specrt.app.compare.systems import llama_cpp_build_env
from specrt.app.compare.worker_client import WorkerProcess

XEON_FLAGS = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512vbmi",
              "amx_tile", "amx_int8", "amx_bf16", "avx512_fp16"}


def test_llama_cpp_is_built_without_amx_where_the_cpu_has_it():
    env = llama_cpp_build_env(XEON_FLAGS)
    args = env["CMAKE_ARGS"].split()
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AMX_TILE=OFF" in args and "-DGGML_AMX_INT8=OFF" in args
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX2=ON"} <= set(args)
    assert not any("AMX" in a and a.endswith("=ON") for a in args)
    assert llama_cpp_build_env({"avx", "avx2", "fma", "avx512f"}) == {}  # no AMX: llama.cpp's own native build


def test_a_worker_killed_by_a_signal_is_named(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    with pytest.raises(SystemUnavailable, match=r"worker killed by SIGILL \(an illegal instruction: the system's "
                                                r"build uses CPU instructions"):
        WorkerProcess(sys.executable, script, {}, tmp_path / "worker.log")
