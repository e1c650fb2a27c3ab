"""Where a GPU would run each node of a bundle's graphs, read without a GPU (`specrt info BUNDLE --placement`).

ONNX Runtime gives a node to a provider only where that provider registers a kernel for the node's op, domain,
opset and element types; everything else falls back to the CPU provider, with copies across on every call. Among
the nodes a GPU runs, some take a slow path (MatMulNBits at float32 dequantizes then multiplies; GroupQueryAttention
with an attention bias leaves flash attention). And a control-flow node (If, Loop, Scan) is driven from the host:
its condition or trip count is read back each call. This module walks every graph (subgraphs too), infers each
value's element type, and looks each node up in the registration table of convert/ort_kernels.py (kept with the
ONNX Runtime version and source files it was read from). MIGraphX compiles what its parser supports; a graph with
unsupported nodes runs partly on the CPU, and past a threshold wholly (ort_kernels.MIGRAPHX_MAX_UNSUPPORTED).

Verdicts per node: `gpu` (its fast path), `gpu-slow` (a kernel, off its fast path: the reason says why),
`host-loop` (control flow), `cpu-fallback` (no kernel for it), `cpu-shape` (shape arithmetic that ONNX Runtime
itself moves to the CPU beside a CUDA graph: GetCpuPreferredNodes; not a missing kernel, but it too fails a session
with `session.disable_cpu_ep_fallback`, and it is a host round trip).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx

from specrt.convert import ort_kernels
from specrt.errors import SpecrtError

PROVIDERS = {"cuda": "CUDAExecutionProvider", "migraphx": "MIGraphXExecutionProvider"}
CONTROL_FLOW = ("If", "Loop", "Scan")


@dataclass(frozen=True)
class Placement:
    node: str
    op: str  # domain-qualified where not ONNX's own: com.microsoft.GroupQueryAttention
    type: str  # the element type the kernel is chosen by
    verdict: str  # gpu | gpu-slow | host-loop | cpu-fallback | cpu-shape
    reason: str = ""


def _types(graph: onnx.GraphProto, outer: dict[str, str]) -> dict[str, str]:
    """Element type of every value in a graph: its inputs, initializers and value_info, then each node's outputs
    by the op's type rule (ort_kernels.output_type), in graph order."""
    types = dict(outer)
    for value in (*graph.input, *graph.value_info, *graph.output):
        elem = value.type.tensor_type.elem_type
        if elem:
            types[value.name] = ort_kernels.ELEM_NAMES.get(elem, str(elem))
    for init in graph.initializer:
        types[init.name] = ort_kernels.ELEM_NAMES.get(init.data_type, str(init.data_type))
    for node in graph.node:
        ins = [types.get(name, "") if name else "" for name in node.input]
        for j, out in enumerate(node.output):
            if out and out not in types:
                types[out] = ort_kernels.output_type(node, j, ins, types)
    return types


def _cpu_preferred(graph: onnx.GraphProto, types: dict[str, str], on_gpu: set[str], small: set[str]) -> set[str]:
    """Names of the nodes ONNX Runtime moves to the CPU beside a CUDA graph (GetCpuPreferredNodes, 1.31: read in
    core/framework/fallback_cpu_capability.cc and checked against onnxruntime-gpu 1.31.1's partitioner): starting
    from the host-memory outputs of GPU kernels (Shape's), a GPU node goes to the CPU when every input is such a
    host tensor, a small initializer (<= 100 elements) or a graph input, none is float16/bfloat16, and the kernel does
    not itself read that input on the host (ort_kernels.HOST_INPUTS); its outputs then seed further, as do the outputs
    of nodes no GPU kernel takes. `small`: the small initializers of this graph and the graphs around it."""
    inputs = {i.name for i in graph.input}
    host = {o for n in graph.node if n.op_type in ort_kernels.HOST_OUTPUTS and n.name in on_gpu for o in n.output}
    host |= {o for n in graph.node if n.name not in on_gpu for o in n.output}  # what the CPU provider computes
    moved = set()
    for node in graph.node:
        if node.name not in on_gpu or node.op_type in ort_kernels.HOST_OUTPUTS:
            continue
        names = [n for n in node.input if n]
        if not any(n in host for n in names):
            continue
        held = ort_kernels.HOST_INPUTS.get(node.op_type, ())
        if all(types.get(n) not in ("float16", "bfloat16") and (n in small or n in inputs or n in host)
               and not (n in host and j in held) for j, n in enumerate(node.input) if n):
            moved.add(node.name)
            host.update(o for o in node.output if o)
    return moved


def _elements(init: onnx.TensorProto) -> int:
    count = 1
    for d in init.dims:
        count *= d
    return count


def place_graph(graph: onnx.GraphProto, provider: str, opset: int, outer: dict[str, str] | None = None,
                outer_small: frozenset[str] = frozenset()) -> list[Placement]:
    """Every node's placement under `provider` (cuda | migraphx), those of subgraphs after their parent (outer: the
    types of the values around a subgraph, outer_small: its small initializers, which a subgraph may read)."""
    types = _types(graph, outer or {})
    small = outer_small | {i.name for i in graph.initializer if _elements(i) <= 100}
    found = []
    for node in graph.node:
        ins = [types.get(name, "") if name else "" for name in node.input]
        found.append((node, ins, ort_kernels.lookup(provider, node, ins, opset)))
    on_gpu = {node.name for node, _, (verdict, _, _) in found if verdict != "cpu-fallback"}
    preferred = _cpu_preferred(graph, types, on_gpu, small) if provider == "cuda" else set()
    out: list[Placement] = []
    for node, ins, (verdict, reason, elem) in found:
        op = f"{node.domain}.{node.op_type}" if node.domain and node.domain != "ai.onnx" else node.op_type
        if node.op_type in CONTROL_FLOW and verdict != "cpu-fallback":
            verdict, reason = "host-loop", f"{node.op_type} reads its condition or trip count on the host every call"
        elif node.name in preferred:
            verdict, reason = "cpu-shape", "shape arithmetic ONNX Runtime moves to the CPU (fails disable_cpu_ep_fallback)"
        out.append(Placement(node.name or node.op_type, op, elem, verdict, reason))
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                out.extend(place_graph(sub, provider, opset, types, small))
    return out


def place_model(path: Path, provider: str) -> list[Placement]:
    """Placements of one ONNX file's nodes (its weights are not read)."""
    if provider not in PROVIDERS:
        raise SpecrtError(f"--placement {provider}: one of {', '.join(PROVIDERS)}")
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return place_graph(model.graph, provider, opset)


def bundle_graphs(bundle: Path) -> dict[str, Path]:
    """The bundle's ONNX graphs by role: target, then each drafter's."""
    from specrt.bundle import read_manifest

    manifest = read_manifest(Path(bundle))
    graphs = {"target": Path(bundle) / manifest.target.file}
    for drafter in manifest.drafters:
        file = getattr(getattr(drafter, "graph", None), "file", None)
        if file:
            graphs[drafter.name] = Path(bundle) / file
    return graphs


@dataclass(frozen=True)
class Summary:
    nodes: int
    by_verdict: dict[str, int]
    off_gpu: list[Placement]  # cpu-fallback, gpu-slow and host-loop nodes

    @property
    def clean(self) -> bool:
        """Every node on a GPU kernel's fast path (or ONNX Runtime's own shape arithmetic on the CPU)."""
        return not self.off_gpu

    @property
    def strict(self) -> bool:
        """Clean, and no shape arithmetic on the CPU either: a session with disable_cpu_ep_fallback would open."""
        return self.clean and not self.by_verdict.get("cpu-shape")


def summarize(placements: list[Placement]) -> Summary:
    counts = Counter(p.verdict for p in placements)
    off = [p for p in placements if p.verdict in ("cpu-fallback", "gpu-slow", "host-loop")]
    return Summary(len(placements), dict(counts), off)


def report(name: str, placements: list[Placement], provider: str) -> list[str]:
    """Lines for `specrt info --placement`: the counts, then the nodes off the GPU or its fast path, grouped."""
    s = summarize(placements)
    counts = ", ".join(f"{s.by_verdict.get(v, 0)} {v}" for v in ("gpu", "cpu-shape", "gpu-slow", "host-loop",
                                                                   "cpu-fallback"))
    lines = [f"{name}: {s.nodes} nodes under {PROVIDERS[provider]}: {counts}"]
    groups = Counter((p.verdict, p.op, p.type, p.reason) for p in s.off_gpu)
    for (verdict, op, elem, reason), n in sorted(groups.items()):
        lines.append(f"  {verdict:12s} {n:4d} x {op} ({elem or '?'}): {reason}")
    if provider == "migraphx":
        unsupported = s.by_verdict.get("cpu-fallback", 0)
        if unsupported > ort_kernels.MIGRAPHX_MAX_UNSUPPORTED:
            lines.append(f"  MIGraphX takes no part of a graph with more than {ort_kernels.MIGRAPHX_MAX_UNSUPPORTED} "
                         f"unsupported nodes: this one ({unsupported}) would run wholly on the CPU")
    return lines
