"""`specrt convert TARGET --drafter mtp[:FOLDER]`: the target's own MTP module (or one trained for it by
`specrt train-drafter --kind mtp`, in FOLDER) into the bundle.

The module is found in the target's checkpoint or the folder (DeepSeek-V3/GLM-4.5, Qwen3-Next or MiMo
layout, see models/mtp.py), checked tensor by tensor, exported to mtp.onnx with its own KV cache (convert/mtp_graph.py)
and validated against its torch definition. The target graph then emits the residual stream after its last
layer, which the module reads (the pipeline asks `hidden_layers_for` before building it).
"""

from __future__ import annotations

import dataclasses
from collections import ChainMap
from collections.abc import Mapping
from pathlib import Path

from specrt import archs
from specrt.bundle import KVLayout, TargetGraph
from specrt.errors import SourceError

STEM = "mtp"


def check(arg: str, precision: str) -> None:
    """Nothing to refuse before work starts beyond the checkpoint folder (convert/drafter_bundle.py checks it)."""


def stages(arg: str) -> int:
    return 2  # build, validate


def hidden_layers_for(folder: str, loaded) -> tuple[int, ...]:
    """The last layer's residual stream; checks first that the module is there and fits the target."""
    from specrt.models.mtp import load_mtp_from_target

    # the shared embedding table and lm_head stay in the source (reading them here was 8 GB for a 248k vocabulary)
    load_mtp_from_target(loaded.config, _weights(loaded, folder), lazy_shared=True)
    return (loaded.config.num_layers - 1,)


def _weights(loaded, folder: str) -> Mapping:
    """Where the module is looked for: the target's own weights, or a module folder's (mtp:FOLDER, written by
    `specrt train-drafter --kind mtp`), checked against the target it was trained for."""
    from specrt.models.hf_loader import load_hf_weights, read_hf_config
    from specrt.models.tensor_source import Subset

    if not folder:
        # a qwen35 GGUF carries its MTP module as its last block (nextn), read as model.mtp.* (archs/qwen3_5.py)
        if loaded.source.kind not in archs.of(loaded.config).mtp_sources:
            raise SourceError(f"--drafter mtp reads the MTP module from an HF safetensors folder; "
                              f"{loaded.source.path} is a {loaded.source.kind} source (or give mtp:FOLDER)")
        return loaded.weights
    path = Path(folder).expanduser()
    hf, cfg = read_hf_config(path), loaded.config
    for key, ours in (("num_hidden_layers", cfg.num_layers), ("hidden_size", cfg.hidden_size), ("vocab_size", cfg.vocab_size)):
        if key in hf and int(hf[key]) != ours:
            raise SourceError(f"{path}: MTP module was made for a target with {key} {hf[key]}; this target has {ours}")
    target_own = ("model.mtp", f"model.layers.{cfg.num_layers}.")  # a module the target ships is not this one's
    target_keeps = Subset(loaded.weights, lambda name: not name.startswith(target_own))
    return ChainMap(load_hf_weights(path), target_keeps)  # the folder's tensors first, read when used


def add(spec: str, folder: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages,
        build_graph=None, *, device: str = "cpu") -> dict:
    """Write the module's graph into tmp; returns its manifest entry."""
    from specrt.convert.gpu_profile import activation_dtype
    from specrt.convert.head_graph import export_head, head_precision
    from specrt.convert.mtp_graph import _graph_weights, _MtpBuilder
    from specrt.convert.target_graph import GraphOptions
    from specrt.models.mtp import load_mtp_from_target, model_from_tensors

    # the target's embedding table and lm_head stay in the source until the graph builder reads them (memory: a
    # 248k-token vocabulary makes each 4 GB in float32)
    cfg, tensors = load_mtp_from_target(loaded.config, _weights(loaded, folder), lazy_shared=True)
    opts = GraphOptions(precision=head_precision(precision), max_context=max_context, device=device)
    torch_module, embed = model_from_tensors(cfg, tensors)
    inputs, validation = export_head(_MtpBuilder(cfg, _graph_weights(tensors), opts), torch_module, embed, _torch_name, tmp,
                               STEM, providers, stages, "MTP")
    c = cfg.layer
    graph = TargetGraph(file=f"{STEM}.onnx", data_file=f"{STEM}.onnx.data", precision=opts.precision, inputs=inputs,
                        outputs=("logits", "hidden_out"), hidden_size=c.hidden_size)
    kv = KVLayout(layers=1, kv_heads=c.num_kv_heads, head_dim=c.head_dim, max_context=max_context,
                  dtype=activation_dtype(opts.precision, device))
    return {
        "kind": "mtp", "name": "mtp", "spec": spec, "source": str(Path(folder).expanduser() if folder else loaded.source.path),
        "layout": cfg.layout.name, "model_config": c.to_dict(), "graph": dataclasses.asdict(graph),
        "kv": dataclasses.asdict(kv), "vocab_size": c.vocab_size, "draft_vocab_size": c.vocab_size,
        "aux_layers": [loaded.config.num_layers - 1], "target_hidden_size": c.hidden_size,
        "validation": validation,
    }


def _torch_name(graph_name: str) -> str:
    """A graph builder weight name -> the torch module's (models/mtp.py)."""
    if graph_name.startswith("model.layers.0."):
        return "block." + graph_name[len("model.layers.0."):]
    return {"lm_head.weight": "head.weight"}.get(graph_name, graph_name)
