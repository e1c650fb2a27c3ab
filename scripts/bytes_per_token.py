"""The weight bytes one decoding step reads from a target graph: what a one-token call must stream from memory.

    python scripts/bytes_per_token.py BUNDLE/target.onnx [BUNDLE2/target.onnx ...]

Every initializer counts in full, except an embedding table that is only gathered from (a row a token) and a
mixture-of-experts layer's expert weights, which count k / E (a token reads its k chosen experts of E; the
initializers of a MoE / QMoE node or of specrt's MoE operator, k from the node or from its TopK). Sizes are read from
the graph's external-data records, not from the data file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

EXPERT_OPS = {"MoE", "QMoE"}


def _sizes(model: onnx.ModelProto) -> dict[str, int]:
    out = {}
    for t in model.graph.initializer:
        length = next((int(e.value) for e in t.external_data if e.key == "length"), None)
        out[t.name] = length if length is not None else len(t.raw_data)
    return out


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _nodes(sub)


def bytes_per_token(path: Path) -> dict[str, float]:
    model = onnx.load(str(path), load_external_data=False)
    sizes = _sizes(model)
    nodes = list(_nodes(model.graph))
    experts = 0.0
    expert_inits, gathered_only, used_elsewhere = set(), set(), set()
    topk = [n for n in nodes if n.op_type == "TopK"]
    for node in nodes:
        if node.op_type in EXPERT_OPS:
            attrs = {a.name: a.i for a in node.attribute}
            weights = [i for i in node.input[2:] if i in sizes]
            expert_inits.update(weights)
            # specrt's MoE says E; QMoE's packed weights lead with it. QMoE says k; specrt's takes TopK's ids
            e = attrs.get("experts") or next(t.dims[0] for t in model.graph.initializer if t.name == weights[0])
            k = attrs.get("k") or _topk_k(model, topk)
            experts += sum(sizes[w] for w in weights) * k / e
        elif node.op_type.startswith("Gather"):  # ONNX's Gather takes the table first, specrt's GatherQ* second
            table = node.input[1] if node.domain == "specrt.ggml" else node.input[0]
            gathered_only.update(i for i in (table,) if i in sizes)
        else:
            used_elsewhere.update(i for i in node.input if i in sizes)
    gathered = {n for n in gathered_only if n not in used_elsewhere}
    dense = sum(s for n, s in sizes.items() if n not in expert_inits and n not in gathered)
    return {"dense_gb": dense / 1e9, "experts_gb": experts / 1e9, "total_gb": (dense + experts) / 1e9,
            "gathered_gb": sum(sizes[n] for n in gathered) / 1e9, "all_initializers_gb": sum(sizes.values()) / 1e9}


def _topk_k(model: onnx.ModelProto, topk) -> int:
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if not t.external_data}
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = onnx.numpy_helper.to_array(n.attribute[0].t)
    return int(consts[topk[0].input[1]].reshape(-1)[0])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graphs", nargs="+", type=Path)
    for g in ap.parse_args().graphs:
        r = bytes_per_token(g)
        print(f"{g}: {r['total_gb']:.3f} GB a token (dense {r['dense_gb']:.3f}, experts {r['experts_gb']:.3f}; "
              f"gathered tables {r['gathered_gb']:.3f}, all initializers {r['all_initializers_gb']:.3f})")
