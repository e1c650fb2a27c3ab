"""The conversion path before streaming, kept as the oracle the streaming path must match byte for byte.

Everything is in memory at once: all weights as float32, the whole torch model for int4 calibration (a forward
hook per down projection), every projection quantized up front, the whole ModelProto with its initializers,
then onnx.save_model with external data. `python tests/inmemory_convert.py SOURCE OUT_FOLDER PRECISION` writes
a target graph this way (to compare a real model's files with a streamed conversion's).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import torch

from specrt.convert.smoothing import smooth_down_proj
from specrt.convert.target_graph import GraphOptions, build_target_graph, quantize_model


def down_proj_input_max(torch_model, prompts: list[list[int]]) -> dict[int, np.ndarray]:
    """Per layer, max |input| per channel of mlp.down_proj over the prompts, by hooks on the whole model."""
    stats: dict[int, np.ndarray] = {}
    hooks = []
    for i, layer in enumerate(torch_model.model.layers):
        def hook(_module, inputs, _output, i=i):
            m = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0).numpy()
            stats[i] = np.maximum(stats[i], m) if i in stats else m

        hooks.append(layer.mlp.down_proj.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for ids in prompts:
                torch_model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return stats


def write_graph_in_memory(cfg, weights: dict[str, np.ndarray], opts: GraphOptions, calibration: list[list[int]],
                          folder: Path, stem: str = "target") -> None:
    """<stem>.onnx + <stem>.onnx.data in folder, the way conversion wrote them before streaming."""
    from specrt.convert.pipeline import _torch_model

    quantized = None
    if opts.precision == "int4":
        weights = dict(smooth_down_proj(weights, down_proj_input_max(_torch_model(cfg, weights), calibration)))
        quantized = quantize_model(cfg, weights, opts.int4_block_size)
        weights = {n: w for n, w in weights.items() if n not in quantized}
    model = build_target_graph(cfg, weights, opts, quantized)
    onnx.save_model(model, str(Path(folder) / f"{stem}.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{stem}.onnx.data", size_threshold=1024)


def main(source: str, out: str, precision: str) -> None:
    from specrt.convert import sources
    from specrt.convert.pipeline import DEFAULT_MAX_CONTEXT, _tokenize
    from specrt.convert.smoothing import CALIBRATION_TEXTS
    from specrt.convert.tokenizer import write_tokenizer

    loaded = sources.load(sources.resolve(source))
    cfg = loaded.config
    folder = Path(out)
    folder.mkdir(parents=True)
    write_tokenizer(loaded.source.path, loaded.source.kind, folder, cfg.eos_token_ids, cfg.bos_token_id)
    max_context = min(cfg.max_position, DEFAULT_MAX_CONTEXT)
    calibration = _tokenize(folder, CALIBRATION_TEXTS, cfg.vocab_size, max_context)
    opts = GraphOptions(precision=precision, max_context=max_context)
    write_graph_in_memory(cfg, loaded.weights.materialize(), opts, calibration, folder)


if __name__ == "__main__":
    main(*sys.argv[1:4])
