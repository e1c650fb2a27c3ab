"""A small helper for writing ONNX graphs node by node with unique names and numpy initializers.

With an `ExternalData` file, every initializer of 1 KB or more goes to that file the moment it is made and the
graph keeps only its location: building a model's graph then holds one weight at a time, never the model. The
file's layout is byte for byte what `onnx.save_model(save_as_external_data=True, all_tensors_to_one_file=True,
size_threshold=1024)` writes for the same initializers (appended in order, unaligned), so both paths give the
same bundle.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.kernels import ggml_ops

MS_DOMAIN = "com.microsoft"
OPSET = 21

NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.uint8): TensorProto.UINT8,
}


ONNX_TO_NP = {v: k for k, v in NP_TO_ONNX.items()}
EXTERNAL_THRESHOLD = 1024  # onnx.save_model's default size_threshold (compared with sys.getsizeof of the bytes)


class ExternalData:
    """One external-data file that initializers are appended to as they are made (see the module docstring)."""

    def __init__(self, folder: Path, location: str):
        self.path, self.location = Path(folder) / location, location
        self._file = open(self.path, "xb")
        self.index: dict[str, tuple[int, int, int, tuple[int, ...]]] = {}  # name -> (offset, length, type, dims)
        self.inline: dict[str, np.ndarray] = {}  # the initializers small enough to stay in the graph

    def tensor(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        """The initializer for an array: its bytes appended to the file (written from the array itself, never
        copied: a 128k x 4096 embedding table is 2 GB), or inline when under 1 KB (onnx.save_model's rule)."""
        array = np.ascontiguousarray(array)
        if sys.getsizeof(b"") + array.nbytes < EXTERNAL_THRESHOLD:
            tensor = numpy_helper.from_array(array, name)
            self.inline[name] = array.copy()  # kept to be read back too
            return tensor
        if array.dtype.byteorder == ">":
            raise ValueError(f"{name}: big-endian arrays are not written")
        tensor = onnx.TensorProto(name=name, dims=array.shape, data_type=NP_TO_ONNX[array.dtype])
        offset = self._file.tell()
        self._file.write(memoryview(array.reshape(-1)).cast("B"))
        # the fields and their order as onnx.external_data_helper.set_external_data writes them
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", offset), ("length", array.nbytes)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        self.index[name] = (offset, array.nbytes, tensor.data_type, tuple(array.shape))
        return tensor

    def close(self) -> None:
        self._file.close()

    def read(self, name: str, rows: tuple[int, int, int] | None = None) -> np.ndarray:
        """An initializer, read back from the file (which must be closed or flushed) or kept inline. rows (lo, hi,
        n): the tensor holds n rows of equal size (whatever its dims); only rows lo..hi - 1 are read, returned flat."""
        if name in self.inline:
            whole = self.inline[name]
            return whole if rows is None else whole.reshape(rows[2], -1)[rows[0]:rows[1]].reshape(-1)
        offset, length, data_type, dims = self.index[name]
        if rows is not None:
            width = length // rows[2]
            offset, length, dims = offset + rows[0] * width, (rows[1] - rows[0]) * width, (-1,)
        with open(self.path, "rb") as f:
            f.seek(offset)
            raw = f.read(length)
        return np.frombuffer(raw, dtype=ONNX_TO_NP[data_type]).reshape(dims)


class GraphWriter:
    """Collects nodes, initializers, inputs and outputs; `model()` returns the ModelProto. With `external`, large
    initializers are written to that file as they come (the graph is then saved with plain onnx.save_model)."""

    def __init__(self, name: str, external: ExternalData | None = None):
        self.name = name
        self.external = external
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
        if self.external is not None:
            self.initializers.append(self.external.tensor(name, array))
        else:
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
        imports = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
        imports += [helper.make_opsetid(d, 1) for d in sorted({n.domain for n in walk_nodes(graph)} - {"", MS_DOMAIN})]
        model = helper.make_model(graph, opset_imports=imports, producer_name="specrt")
        model.ir_version = 10
        return model


@contextmanager
def captured(g, into: list):
    """Nodes the block adds to g go to `into` instead (a subgraph's body); initializers stay in g (outer scope)."""
    start = len(g.nodes)
    try:
        yield
    finally:
        into.extend(g.nodes[start:])
        del g.nodes[start:]


def walk_nodes(graph: onnx.GraphProto):
    """Every node of a graph, those inside its subgraphs (Scan, If, Loop bodies) included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from walk_nodes(attr.g)
            for sub in attr.graphs:
                yield from walk_nodes(sub)


ROUTER_LOGITS = ".router_logits"  # the suffix of the graph value holding an MoE layer's router logits [N, E]


def float_activation_twin(path: Path, router_outputs: bool = False) -> Path | tuple[Path, dict[int, str]]:
    """A copy of a graph (beside it, sharing its data file) whose MatMulNBits and QMoE keep float activations; with
    router_outputs, every MoE layer's router logits [N, E] are also outputs, returned as {layer: output name}."""
    model = onnx.load(str(path), load_external_data=False)
    for node in walk_nodes(model.graph):
        if node.op_type in ("MatMulNBits", "QMoE") or node.domain == ggml_ops.DOMAIN:  # the GGUF operators take it too
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = 0
    routers = {}
    if router_outputs:  # named layers.{i}.<block>.router_logits by convert/moe_graph.py and convert/gemma4_graph.py
        routers = {int(o.split(".")[1]): o for n in model.graph.node for o in n.output if o.endswith(ROUTER_LOGITS)}
        elem = next((i.type.tensor_type.elem_type for i in model.graph.input if i.name.startswith("past_key_values")),
                    onnx.TensorProto.FLOAT)  # the graph's activations' type, its KV cache's (float16 in a GPU graph)
        model.graph.output.extend(onnx.helper.make_tensor_value_info(name, elem, None) for name in routers.values())
    twin = path.with_name(path.stem + ".exact.onnx")
    onnx.save_model(model, str(twin))
    return (twin, routers) if router_outputs else twin
