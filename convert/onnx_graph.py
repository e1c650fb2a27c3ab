"""A small helper for writing ONNX graphs node by node with unique names and numpy initializers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS_DOMAIN = "com.microsoft"
OPSET = 21

NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.uint8): TensorProto.UINT8,
}


class GraphWriter:
    """Collects nodes, initializers, inputs and outputs; `model()` returns the ModelProto."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count: dict[str, int] = {}
        self._consts: dict[tuple, str] = {}

    def fresh(self, prefix: str) -> str:
        n = self._count.get(prefix, 0)
        self._count[prefix] = n + 1
        return f"{prefix}_{n}" if n else prefix

    def weight(self, name: str, array: np.ndarray) -> str:
        name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, values, dtype=np.int64) -> str:
        """A small constant tensor, shared between nodes that ask for the same values."""
        arr = np.asarray(values, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.weight("const", arr)
        return self._consts[key]

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "", name: str = "", **attrs):
        """Add a node; returns its output name (one output) or list of names."""
        base = self.fresh(name or op_type)
        outs = outputs if isinstance(outputs, list) else [f"{base}/out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain or None, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def add_input(self, name: str, elem_type: int, shape: list):
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def add_output(self, name: str, elem_type: int, shape: list):
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
            producer_name="specrt",
        )
        model.ir_version = 10
        return model
