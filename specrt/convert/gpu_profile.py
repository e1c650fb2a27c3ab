"""What a bundle converted for a GPU (`convert --device cuda|rocm`) is, and where it is validated.

A GPU graph computes in float16 at every precision but fp32: int4, int8 and gguf weights stay in MatMulNBits /
GatherBlockQuantized / QMoE blocks, their scales, the norms, the KV cache and every activation are float16, because
ONNX Runtime's CUDA kernels of GroupQueryAttention and QMoE take float16 or bfloat16 only and MatMulNBits' fast
kernels want them (a float32 MatMulNBits dequantizes then runs a GEMM). The CPU's exactness machinery is left out:
no attention_min_rows padding (Range/Pad around every attention), no call-invariant attention If, no Scan around
the experts, MatMulNBits' accuracy_level 0 (the CPU's int8 activations mean nothing to a GPU kernel). What that
machinery bought on the CPU, batch-invariant mode (greedy speculative output equal to plain decoding's token for
token), is refused on these bundles: exactness on a GPU is a question of its own kernels, not answered yet.
fp32 is the CPU's: a GPU profile refuses it (its attention would run on the CPU).

The machine that converts need not have the GPU. Validation runs on the device's provider where this onnxruntime
has it, else on the CPU provider, which runs the very float16 graph: its float16 kernels where it has them
(MatMulNBits, GroupQueryAttention, the norms, GatedDeltaNet, QMoE) and, where it has none (FastGelu,
CausalConvWithState, float MoE), the float32 kernel between Casts that ONNX Runtime inserts. The graph is held to
the torch reference on the same weights at float16's limit (top-1 agreement), and the conversion says which
provider checked it. `specrt info BUNDLE --placement cuda|migraphx` says node by node where the GPU would run it.
"""

from __future__ import annotations

from specrt.errors import SpecrtError
from specrt.runtime.providers import DEVICE_PROVIDERS, ProviderError, providers_for

GPU_DEVICES = ("cuda", "rocm")
# the provider a device's bundle is built for (and its placement is checked against: specrt/placement)
BUILT_FOR = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "rocm": "MIGraphXExecutionProvider"}


def activation_dtype(precision: str, device: str) -> str:
    """The dtype of a graph's activations, KV cache and float weights: float16 for fp16, and on a GPU for every
    precision but fp32."""
    return "float16" if precision == "fp16" or (device != "cpu" and precision != "fp32") else "float32"


def check_profile(device: str, precision: str) -> None:
    """Refuse, in one line, a precision the device's graphs cannot run at."""
    if device not in BUILT_FOR:
        raise SpecrtError(f"--device {device}: one of {', '.join(BUILT_FOR)}")
    if device == "cpu" and precision == "fp16":
        raise SpecrtError("fp16 bundles are for GPUs: use --device cuda or rocm (or --precision fp32, int8 or int4 on "
                          "the CPU)")
    if device in GPU_DEVICES and precision == "fp32":
        raise SpecrtError(f"--device {device} computes in float16 (the GPU kernels of attention and experts take no "
                          "float32): use --precision int4, int8, gguf or fp16")


def validation_providers(device: str, log) -> list[str]:
    """The providers that validate a device's graph here: the device's own where this onnxruntime has it, else the
    CPU's (said in the log)."""
    if device == "cpu":
        return providers_for("cpu")
    try:
        return providers_for(device)
    except ProviderError:
        log(f"this onnxruntime has no {DEVICE_PROVIDERS[device][0]}: the {device} bundle is built here and validated "
            "on the CPU provider (float16 kernels where it has them, float32 between casts where not)")
        return ["CPUExecutionProvider"]


def built_for(device: str) -> tuple[str, ...]:
    """The manifest's execution_providers: what the bundle was built to run on (the CPU provider last, as ONNX
    Runtime appends it)."""
    return (BUILT_FOR[device],) if device == "cpu" else (BUILT_FOR[device], "CPUExecutionProvider")


def refuse_off_migraphx(graph) -> None:
    """--device rocm: refuse, in one line, a graph with nodes MIGraphX cannot compile (with more than 10 of them it
    would run wholly on the CPU; with fewer, partly, copying across every call)."""
    from specrt.convert.placement import place_model, summarize

    off = summarize(place_model(graph, "migraphx")).off_gpu
    if off:
        ops = sorted({p.op.rsplit(".", 1)[-1] for p in off})
        raise SpecrtError(f"--device rocm: MIGraphX cannot run {len(off)} nodes of this model's graph ({', '.join(ops)}: "
                          f"{off[0].reason}), which would run on the CPU; convert for cuda or the CPU instead")



def float32_twin(graph, out) -> None:
    """Write the float32 twin of a GPU graph to `out` (its weights beside it in `<out>.data`): the same nodes and
    the same weights' values (float16 widened), every float16 value float32, so that a CPU computes the GPU graph's
    structure at float32's rounding (the check of speculation against plain decoding, tests/test_gpu_profile.py)."""
    from pathlib import Path

    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    from specrt.convert.onnx_graph import walk_nodes

    model = onnx.load(str(graph))  # its external data too (a test-size graph)

    def widen(tensor):
        if tensor.data_type == TensorProto.FLOAT16:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))

    def retype(values):
        for value in values:
            if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
                value.type.tensor_type.elem_type = TensorProto.FLOAT

    def walk_graphs(g):
        yield g
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk_graphs(attr.g)

    for g in walk_graphs(model.graph):
        for init in g.initializer:
            widen(init)
        retype(g.input)
        retype(g.output)
        retype(g.value_info)
    for node in walk_nodes(model.graph):
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
            if attr.type == onnx.AttributeProto.TENSOR:
                widen(attr.t)
    out = Path(out)
    onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)
