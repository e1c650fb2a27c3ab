"""Where onnxruntime-gpu itself puts each node of a graph, on a machine without a GPU.

ONNX Runtime's CUDA provider library loads and sets a session up completely (partitioning, GetCpuPreferredNodes,
kernel constructors, prepacking) when the CUDA libraries it links are stand-ins: bench/cuda_stubs/*.c, one fake SM 9.0
device of 80 GB whose memory is host memory, everything else a no-op. With the session's log at its most verbose,
ONNX Runtime prints which provider got each node. Nothing runs a kernel, so this says where nodes go and whether the
session opens (with `session.disable_cpu_ep_fallback` on: whether any node is left to the CPU), not how fast they run.
convert/placement.py predicts the same from a table; tests/test_cuda_partition.py (full tier) holds one to the other.

    python bench/cuda_partition.py MODEL.onnx [--strict] [--work DIR]   # prints provider: nodes, or the error

Needs gcc, the CUDA runtime header that triton's wheel ships, and onnxruntime-gpu's wheel (pip download, once, into
DIR; about 255 MB) for this Python.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ORT_GPU = "onnxruntime-gpu==1.31.1"  # the newest GPU wheel on PyPI (CUDA 13)
STUBS = Path(__file__).resolve().parent / "cuda_stubs"
LIBRARIES = {  # the soname ONNX Runtime's CUDA provider links -> its stand-in's sources
    "libcudart.so.13": ("cudart_device.c", "cudart_noops.c"), "libcublas.so.13": ("cublas.c",),
    "libcublasLt.so.13": ("cublaslt.c",), "libcudnn.so.9": ("cudnn.c",), "libcurand.so.10": ("curand.c",),
    "libcuda.so.1": ("cuda.c",), "libnvinfer.so.10": ("nvinfer.c",), "libnvonnxparser.so.10": ("nvonnxparser.c",),
}


def default_work() -> Path:
    return Path(os.environ.get("SPECRT_CACHE", Path.home() / ".cache" / "specrt")) / "cuda-partition"


def build_stubs(out: Path) -> Path:
    """Compile the stand-in libraries into out/lib (once)."""
    import triton

    include = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    lib = out / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    for soname, sources in LIBRARIES.items():
        target = lib / soname
        if target.is_file():
            continue
        version = out / f"{soname}.map"
        version.write_text(f"{soname} {{ global: *; }};\n")  # the versioned symbols the provider asks for
        subprocess.run(["gcc", "-shared", "-fPIC", "-O0", f"-I{include}", "-o", str(target),
                        *(str(STUBS / s) for s in sources), f"-Wl,--version-script={version}",
                        f"-Wl,-soname,{soname}"], check=True)
    return lib


def fetch_ort_gpu(out: Path) -> Path:
    """onnxruntime-gpu unpacked under out/site (downloaded once for this Python)."""
    site = out / "site"
    if (site / "onnxruntime" / "capi").is_dir():
        return site
    wheels = out / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "-d", str(wheels), ORT_GPU], check=True)
    wheel = next(wheels.glob("onnxruntime_gpu-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import onnxruntime as ort
so = ort.SessionOptions()
so.log_severity_level = 0
so.log_verbosity_level = 0
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
strict = sys.argv[3] == "1"
if strict:
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
providers = ["CUDAExecutionProvider"] + ([] if strict else ["CPUExecutionProvider"])
try:
    ort.InferenceSession(sys.argv[2], so, providers=providers)
    print(json.dumps({"error": ""}), file=sys.stdout)
except Exception as exc:
    print(json.dumps({"error": str(exc).splitlines()[0][:400]}), file=sys.stdout)
"""


def partition(model: Path, strict: bool = False, work: Path | None = None) -> dict:
    """{"error": "" or the session's error, "nodes": {provider: [node names]}} for one ONNX file, graph
    optimizations off (so that node names are the graph's own)."""
    work = work or default_work()
    lib, site = build_stubs(work), fetch_ort_gpu(work)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(site), str(model), "1" if strict else "0"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"the partitioner crashed: {proc.stderr[-500:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    nodes, current = {}, None
    for line in proc.stderr.splitlines():  # VerifyEachNodeIsAssignedToAnEp's listing
        if m := re.search(r"Node\(s\) placed on \[(\w+)\]", line):
            current = m.group(1)
        elif current and (m := re.search(r"VerifyEachNodeIsAssignedToAnEp\]\s+\S+ \((.*)\)$", line)):
            nodes.setdefault(current, []).append(m.group(1))
        elif m := re.search(r"All nodes placed on \[(\w+)\]", line):
            nodes[m.group(1)] = ["*"]  # every node
    result["nodes"] = nodes
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--strict", action="store_true", help="session.disable_cpu_ep_fallback on")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    result = partition(args.model, args.strict, args.work)
    for provider, names in result["nodes"].items():
        print(f"{provider}: {len(names) if names != ['*'] else 'all'} nodes" + ("" if names == ["*"] else
                                                                              f" ({', '.join(names[:20])})"))
    if result["error"]:
        print("error:", result["error"])
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
