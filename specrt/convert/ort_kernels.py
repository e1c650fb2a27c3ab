"""ONNX Runtime's kernel registrations for the GPU providers, and the conditions of their fast paths.

What convert/placement.py reads. CUDA's registrations are convert/ort_cuda_kernels.txt, read from the kernel
registrations of onnxruntime-gpu 1.31.1's CUDA provider library (its header and docs/gpu.md say how); MIGraphX's
supported ops and parser limits are below, from ONNX Runtime's MIGraphX provider and AMDMIGraphX's ONNX parsers.
Each entry: the element types a provider registers for the op's deciding type constraint (the type of input
`type_input`) and, for the ops whose speed depends on more than the type, a function that names what keeps a node
off its fast path (read from the kernels' sources: contrib_ops/cuda/quantization/matmul_nbits.cc,
contrib_ops/cuda/bert/group_query_attention.cc, contrib_ops/cuda/moe/moe_quantization.cc).

Held to ONNX Runtime's own partitioner: bench/cuda_partition.py sets onnxruntime-gpu's CUDA provider up on stand-in
CUDA libraries (tests/test_cuda_partition.py, full tier); on a GPU, bench/gpu_families.py reads the running session's
placement from its profile beside this prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

CUDA_TABLE = Path(__file__).with_name("ort_cuda_kernels.txt")  # domain|op|since|constraints, with its source
MIGRAPHX_SOURCE = ("onnxruntime/core/providers/migraphx/migraphx_execution_provider_utils.h",
                   "AMDMIGraphX src/onnx/parse_*.cpp")

F = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64")
ALL = F + INTS + ("int8", "uint8", "bool")
HALF = ("float16", "bfloat16")
MS = "com.microsoft"
_TYPE_NAMES = {"float": "float32", "double": "float64"}


@dataclass(frozen=True)
class Kernel:
    types: tuple[str, ...]  # element types registered for the deciding constraint
    type_input: int = 0  # which input carries it
    note: str = ""


# the type constraint that decides an op's kernel, and the input that carries it, where not "T" of input 0
_DECIDING = {"Identity": ("V", 0), "If": ("B", 0), "Loop": ("B", 1), "Scan": ("V", 0), "Cast": ("T1", 0),
             "MatMulNBits": ("T1", 0), "GatherBlockQuantized": ("T2", 2), "Shape": ("T", 0), "Where": ("T", 1),
             "ConstantOfShape": ("T1", 0)}


def read_table(path: Path = CUDA_TABLE) -> dict[tuple[str, str], Kernel]:
    """The registration table: (domain, op) -> its deciding constraint's types (the newest registration's)."""
    table = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        domain, op, _since, constraints = line.split("|", 3)
        name, index = _DECIDING.get(op, ("T", 0))
        types = ()
        for part in constraints.split(" [", 1)[0].split("; "):
            key, _, values = part.partition(": ")
            if key == name:
                types = tuple(_TYPE_NAMES.get(v, v) for v in values.split(", ") if not v.startswith("seq "))
        table[("" if domain == "ai.onnx" else domain, op)] = Kernel(types, index)
    return table


CUDA: dict[tuple[str, str], Kernel] = read_table()

# ops whose CUDA kernels write an output to host memory (the seeds of GetCpuPreferredNodes), and the inputs CUDA
# kernels read on the host (a host tensor there keeps the consuming node on the GPU): the kernel definitions'
# memory types, as read for onnxruntime-gpu 1.31.1
HOST_OUTPUTS = ("Shape", "Size")
HOST_INPUTS = {"Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "Slice": (1, 2, 3, 4),
               "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "TopK": (1,), "Pad": (1, 2, 3), "Tile": (1,),
               "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceSumSquare": (1,),
               "ReduceLogSumExp": (1,), "GroupQueryAttention": (6,), "If": (0,), "Loop": (0, 1)}

# MIGraphX: the ops its provider hands to the MIGraphX compiler (types are the compiler's to convert); the provider
# leaves the whole graph to the CPU where more than this many nodes are unsupported
MIGRAPHX_MAX_UNSUPPORTED = 10
MIGRAPHX = {
    **{("", op): Kernel(ALL) for op in (
        "Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Softmax", "Sigmoid", "Tanh", "Exp", "Sqrt", "Reciprocal",
        "Sum", "ReduceSum", "ReduceSumSquare", "ReduceLogSumExp", "ReduceMax", "ReduceMin", "Reshape", "Transpose",
        "Slice", "Split", "Identity", "Unsqueeze", "Squeeze", "Expand", "Concat", "Gather", "Shape",
        "ConstantOfShape", "ScatterElements", "Cast", "If", "Loop", "Where", "Max", "Min", "Range", "Greater",
        "Equal", "Not", "TopK", "Pad", "Constant", "LayerNormalization", "SimplifiedLayerNormalization")},
    **{(MS, op): Kernel(ALL) for op in ("SkipSimplifiedLayerNormalization", "GroupQueryAttention", "MatMulNBits",
                                        "RotaryEmbedding", "FastGelu")},
}


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _input(node: onnx.NodeProto, j: int) -> str:
    return node.input[j] if j < len(node.input) else ""


# -- fast paths: a reason the node is off its fast path, or "" ---------------------------------------------------
def _cuda_matmul_nbits(node, ins) -> str:
    """The decode GEMV (calls of up to 16 rows: decoding and verification) takes float16/bfloat16, 4 or 8 bits, no
    g_idx, uint8 or no zero points; longer calls (prefill) dequantize then run cuBLAS either way."""
    if ins[0] not in HALF:
        return f"{ins[0]} activations: dequantize-then-GEMM (the fast kernels take float16/bfloat16)"
    bits, block = _attr(node, "bits", 4), _attr(node, "block_size", 0)
    if bits not in (4, 8):
        return f"{bits}-bit weights: no fast kernel"
    if block not in (16, 32, 64, 128):
        return f"blocks of {block}: the fast kernels take 16-128"
    if _input(node, 4):
        return "g_idx: act-order weights take the dequantize path"
    return ""


def _cuda_gqa(node, ins) -> str:
    if _input(node, 10):
        return "attention_bias: the unfused kernel (no flash / memory-efficient attention)"
    return ""


def _cuda_qmoe(node, ins) -> str:
    bits = _attr(node, "expert_weight_bits", 4)
    if bits not in (4, 8):
        return f"{bits}-bit experts: no kernel"
    return ""


CUDA_FAST_PATH = {(MS, "MatMulNBits"): _cuda_matmul_nbits, (MS, "GroupQueryAttention"): _cuda_gqa,
                  (MS, "QMoE"): _cuda_qmoe}


def _migraphx_gqa(node, ins) -> str:
    if len(node.input) >= 12:
        return "head_sink (attention sinks): MIGraphX's parser throws on 12 or more inputs"
    if _input(node, 10):
        return "attention_bias is not parsed: a tree's mask would be dropped"
    return ""


def _migraphx_matmul_nbits(node, ins) -> str:
    if _attr(node, "bits", 4) != 4:
        return f"{_attr(node, 'bits')}-bit weights: MIGraphX parses 4-bit MatMulNBits only"
    if len(node.input) > 4:
        return "more than 4 inputs (g_idx, bias): MIGraphX drops the zero points and the bias (wrong results)"
    return ""


MIGRAPHX_FAST_PATH = {(MS, "GroupQueryAttention"): _migraphx_gqa, (MS, "MatMulNBits"): _migraphx_matmul_nbits}

TABLES = {"cuda": (CUDA, CUDA_FAST_PATH), "migraphx": (MIGRAPHX, MIGRAPHX_FAST_PATH)}


def lookup(provider: str, node: onnx.NodeProto, ins: list[str], opset: int) -> tuple[str, str, str]:
    """(verdict, reason, element type) of one node under `provider`: gpu, gpu-slow or cpu-fallback."""
    table, fast = TABLES[provider]
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    if (domain, node.op_type) == ("", "Constant"):
        return "gpu", "folded into an initializer when the session loads", ""
    kernel = table.get((domain, node.op_type))
    if kernel is None:
        return "cpu-fallback", f"{provider} registers no {node.op_type} kernel", ""
    elem = ins[kernel.type_input] if kernel.type_input < len(ins) else ""
    if elem and elem not in kernel.types:
        return "cpu-fallback", f"{provider} registers {node.op_type} for {', '.join(kernel.types)} only", elem
    slow = fast.get((domain, node.op_type))
    reason = slow(node, ins) if slow else ""
    if reason and provider == "migraphx":
        return "cpu-fallback", reason, elem
    return ("gpu-slow", reason, elem) if reason else ("gpu", kernel.note, elem)


# -- element types of outputs ------------------------------------------------------------------------------------
_T = onnx.TensorProto
ELEM_NAMES = {_T.FLOAT: "float32", _T.FLOAT16: "float16", _T.BFLOAT16: "bfloat16", _T.DOUBLE: "float64",
              _T.INT64: "int64", _T.INT32: "int32", _T.INT8: "int8", _T.UINT8: "uint8", _T.BOOL: "bool",
              _T.UINT4: "uint4", _T.INT4: "int4"}  # the names the table's types are written in


def output_type(node: onnx.NodeProto, j: int, ins: list[str], types: dict[str, str]) -> str:
    """The element type of a node's j-th output, from its op's type rule and its inputs' types."""
    op = node.op_type
    if op == "Cast":
        return ELEM_NAMES.get(_attr(node, "to"), "")
    if op in ("Shape", "Size", "NonZero", "ArgMax", "ArgMin") or (op == "TopK" and j == 1):
        return "int64"
    if op in ("Greater", "Less", "Equal", "Not", "And", "Or", "GreaterOrEqual", "LessOrEqual"):
        return "bool"
    if op == "ConstantOfShape":
        value = _attr(node, "value")
        return ELEM_NAMES.get(value.data_type, "float32") if value is not None else "float32"
    if op == "Constant":
        value = _attr(node, "value")
        return ELEM_NAMES.get(value.data_type, "") if value is not None else ""
    if op == "Where":
        return ins[1] if len(ins) > 1 else ""
    if op == "GatherBlockQuantized":
        return ins[2] if len(ins) > 2 else ""
    if op in ("Gather", "GatherElements", "GatherND") and ins:
        return ins[0]
    if op in ("If", "Loop", "Scan"):
        body = _attr(node, "then_branch") if op == "If" else _attr(node, "body")
        outs = list(body.output) if body is not None else []
        k = j + 1 if op == "Loop" else j  # a Loop body's first output is its condition
        return ELEM_NAMES.get(outs[k].type.tensor_type.elem_type, "") if k < len(outs) else ""
    if op == "GatedDeltaNet" and j >= 1:  # the recurrent state and its capture: the state's type
        return ins[6] if len(ins) > 6 else ""
    if op == "SkipSimplifiedLayerNormalization" and j == 1:  # mean: float
        return "float32"
    return next((t for t in ins if t), "")
