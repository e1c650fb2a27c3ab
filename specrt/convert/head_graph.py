"""What the graphs of feature-reading draft heads (EAGLE-3, MTP) share: their extra inputs and outputs, and
the check of an exported head against its torch definition.

A head graph takes the target's step inputs plus features [B, S, F] (the target's hidden states the head
reads), hidden [B, S, H] (the head's own previous output) and use_features (bool [1]): the first draft step
reads the target's features, later steps their own output. It returns logits [B, S, V_head] and hidden_out
[B, S, H] (fed back as `hidden`), plus its one layer's present key/value.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from specrt.bundle import SEQLENS_INPUT, TOTAL_LENGTH_INPUT, weight_bits
from specrt.convert.target_graph import io_names


def add_head_inputs(builder, feature_width: int) -> dict:
    """Declare the step inputs, the head inputs and the one-layer KV cache; returns io_names."""
    g, cfg = builder.g, builder.cfg
    io = io_names(cfg, builder.opts.device)
    builder.add_step_inputs()
    g.add_input("features", builder.elem, ["batch_size", "sequence_length", feature_width])
    g.add_input("hidden", builder.elem, ["batch_size", "sequence_length", cfg.hidden_size])
    g.add_input("use_features", TensorProto.BOOL, [1])
    g.add_input(io["past_key"][0], builder.elem, builder.kv_shape())
    g.add_input(io["past_value"][0], builder.elem, builder.kv_shape())
    return io


def add_head_outputs(builder, logits: str, hidden_out: str, vocab: int, io: dict) -> None:
    g, cfg = builder.g, builder.cfg
    if builder.dtype != np.float32:
        logits = g.op("Cast", [logits], to=TensorProto.FLOAT)
    g.op("Identity", [logits], outputs=["logits"])
    g.op("Identity", [hidden_out], outputs=["hidden_out"])
    g.add_output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])
    g.add_output("hidden_out", builder.elem, ["batch_size", "sequence_length", cfg.hidden_size])
    g.add_output(io["present_key"][0], builder.elem, builder.kv_shape())
    g.add_output(io["present_value"][0], builder.elem, builder.kv_shape())


def compare_with_torch(session, head, embed: np.ndarray, steps=((0, 4, True), (4, 1, False), (5, 1, False)),
                       seed: int = 0, max_ctx: int = 16) -> float:
    """Max |difference| of logits and hidden_out between an ORT session over a head graph and the torch head
    (`head.fuse(features)`, `head(embeds, hidden, positions, past_k, past_v)`), over a call from random target
    features followed by single steps that feed back the head's own hidden output."""
    import torch

    rng = np.random.default_rng(seed)
    c = head.cfg.layer
    types = {i.name: i.type for i in session.get_inputs()}
    # the graph's activations' type: float16 in a GPU graph (convert/gpu_profile.py)
    dtype = np.float16 if types["hidden"] == "tensor(float16)" else np.float32
    past_k = np.zeros((1, c.num_kv_heads, max_ctx, c.head_dim), dtype)
    past_v = np.zeros_like(past_k)
    tk = tv = torch.zeros(1, c.num_kv_heads, 0, c.head_dim)
    width = head.cfg.feature_width
    hidden, worst = None, 0.0
    for start, n, use in steps:
        tokens = rng.integers(0, embed.shape[0], size=(1, n))
        pos = np.arange(start, start + n)[None]
        feats = rng.normal(size=(1, n, width)).astype(np.float32) if use else np.zeros((1, n, width), np.float32)
        h_in = hidden if (hidden is not None and not use) else np.zeros((1, n, c.hidden_size), np.float32)
        feed = {"input_ids": tokens, "position_ids": pos, "attention_mask": np.ones((1, start + n), np.int64),
                "attention_bias": np.zeros((1, 1, n, start + n), dtype), "features": feats.astype(dtype),
                "hidden": h_in.astype(dtype), "use_features": np.array([use]), "past_key_values.0.key": past_k,
                "past_key_values.0.value": past_v, TOTAL_LENGTH_INPUT: np.array(start + n, np.int32),
                SEQLENS_INPUT: np.array([start + n - 1], np.int32)}
        logits, h_out, past_k, past_v = session.run(None, {k: v for k, v in feed.items() if k in types})
        h_out = h_out.astype(np.float32)
        with torch.no_grad():
            hid = head.fuse(torch.from_numpy(feats)) if use else torch.from_numpy(h_in)
            t_logits, t_h, k, v = head(torch.from_numpy(embed[tokens]), hid, torch.from_numpy(pos), tk, tv)
        tk, tv = torch.cat((tk, k), 2), torch.cat((tv, v), 2)
        worst = max(worst, float(np.abs(logits - t_logits.numpy()).max()), float(np.abs(h_out - t_h.numpy()).max()))
        hidden = h_out[:, -1:]
    return worst


# largest |logit or hidden difference| a head graph may show against torch: fp32 is exact up to rounding, and so is
# an int4/int8 graph run with float activations against a torch head holding the very same quantized weights. The
# shipped quantized graph computes with int8 activations (MatMulNBits accuracy level 4), which moves logits by a few
# tenths on the real heads and by whole units on random test heads: recorded, not limited.
MAX_DIFF = 1e-3
MAX_DIFF_FP16 = 5e-2  # a GPU head's float16 activations (convert/gpu_profile.py), against the same torch head


def validate_graph(path, quantized: bool, providers, difference, label: str, precision: str):
    """Check a written drafter graph with `difference(session) -> max |diff|` against its torch definition:
    exactly (MAX_DIFF) on the graph itself, or for int4/int8 on its float-activation twin, the torch side holding
    the very same quantized weights; a quantized graph's shipped (int8-activation) difference is recorded. A GPU
    graph (float16 activations) is held as it ships, to MAX_DIFF_FP16. Returns the validation record and an ORT
    session over the shipped graph; ValidationError past the limit."""
    import onnxruntime as ort

    from specrt.convert.onnx_graph import float_activation_twin
    from specrt.errors import ValidationError

    import onnx

    model = onnx.load(str(path), load_external_data=False)
    half = any(i.type.tensor_type.elem_type == TensorProto.FLOAT16 for i in model.graph.input)
    del model
    limit = MAX_DIFF_FP16 if half else MAX_DIFF
    # a GPU graph computes as it ships (float16, no int8 activations): held once, at float16's limit
    exact_path = float_activation_twin(path) if quantized and not half else path
    try:
        session = ort.InferenceSession(str(exact_path), providers=list(providers))
        exact = difference(session)
    finally:
        if exact_path != path:
            exact_path.unlink()
    if not exact <= limit:  # NaN compares false both ways: a graph that outputs NaN fails here
        raise ValidationError(f"{label} graph ({precision}) differs from its torch definition by {exact:.2e} "
                              f"(limit {limit})")
    validation = {"max_abs_diff": exact}
    if exact_path != path:
        del session  # one graph in memory at a time
        session = ort.InferenceSession(str(path), providers=list(providers))
        validation["int8_activations_max_abs_diff"] = difference(session)
    return validation, session


def export_head(builder, module, embed: np.ndarray, rename, tmp, stem: str, providers, stages,
                label: str) -> tuple[tuple[str, ...], dict]:
    """Build the graph (builder), streaming its weights to `<stem>.onnx.data`, save `<stem>.onnx` and validate it
    against the torch module (into which the graph's quantized weights are read back, under the module's names by
    `rename`). Returns the ORT input names (without the cache) and the validation record; ValidationError past
    MAX_DIFF."""
    import torch

    from specrt.convert.quantize import dequantize
    from specrt.convert.target_graph import EMBED, write_graph

    stages.start(f"build {stem} graph")
    written = write_graph(builder, tmp, stem)
    stages.done()
    stages.start(f"validate {stem}")
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name in written.quant_rows:  # the torch head runs the very quantized weights the graph holds
            if name == EMBED:  # the quantized embedding table, which the comparison looks tokens up in
                embed = _QuantizedRows(written, name)
            elif name == "lm_head.weight" and _rows(written, name) > CHUNK_ROWS:  # dequantized a chunk at a time
                _swap_linear(module, rename(name), _chunked_quantized_linear(written, name))
                del params[rename(name)]
            elif params[rename(name)].numel() == 0:  # a shared tensor left in the source (models/mtp.SourceTensor)
                params[rename(name)].data = torch.from_numpy(dequantize(written.quantized(name)))
            else:
                params[rename(name)].copy_(torch.from_numpy(dequantize(written.quantized(name))))
        for name, param in params.items():  # a float graph: the shared tensor as the source holds it
            if param.numel() == 0:
                source = next(v for k, v in builder.w.items() if rename(k) == name)
                param.data = torch.from_numpy(source.read() if hasattr(source, "read") else np.asarray(source))
    validation, session = validate_graph(tmp / f"{stem}.onnx", bool(written.quant_rows), providers,
                                         lambda session: compare_with_torch(session, module, embed), label,
                                         builder.opts.precision)
    stages.done()
    return tuple(i.name for i in session.get_inputs() if not i.name.startswith("past_")), validation


CHUNK_ROWS = 16384  # a quantized matrix of more rows (a 248k-token lm_head: 4 GB as float32) is never made whole


def _rows(written, name: str) -> int:
    return written.quant_rows[name].count


def _swap_linear(module, param_name: str, replacement) -> None:
    """Put `replacement` where the bias-free nn.Linear owning `param_name` ("head.weight") sits in module."""
    path = param_name.rsplit(".", 1)[0]
    parent, _, attr = path.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, attr, replacement)


def _chunked_quantized_linear(written, name: str):
    """x @ W.T for a graph's quantized W [N, K], dequantizing CHUNK_ROWS rows of W at a time (a stand-in for the
    bias-free nn.Linear of an output head whose weight would be gigabytes as float32)."""
    import torch

    from specrt.convert.quantize import dequantize

    class ChunkedQuantizedLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.written, self.name, self.rows = written, name, _rows(written, name)

        def forward(self, x):  # x [..., K] -> [..., N]
            out = torch.empty(*x.shape[:-1], self.rows, dtype=x.dtype)
            for lo in range(0, self.rows, CHUNK_ROWS):
                hi = min(lo + CHUNK_ROWS, self.rows)
                w = torch.from_numpy(dequantize(self.written.quantized(self.name, np.arange(lo, hi))))  # [hi - lo, K]
                out[..., lo:hi] = torch.nn.functional.linear(x, w)
            return out

    return ChunkedQuantizedLinear()


class _QuantizedRows:
    """Rows of a graph's quantized embedding table, dequantized when looked up (the whole table is never made)."""

    def __init__(self, written, name: str):
        self.written, self.name = written, name
        self.shape = (written.quant_rows[name].count, written.quant_rows[name].k)

    def __getitem__(self, ids) -> np.ndarray:
        from specrt.convert.quantize import dequantize

        ids = np.asarray(ids)
        unique, where = np.unique(ids, return_inverse=True)
        return dequantize(self.written.quantized(self.name, unique))[where.reshape(ids.shape)]


def head_precision(target_precision: str) -> str:
    """A head runs quantized beside an int4 or int8 target (int4: about 3x cheaper per call on a CPU), at the
    target's precision; beside an fp16 target (a GPU's) in fp16; else in fp32."""
    return target_precision if weight_bits(target_precision) or target_precision == "fp16" else "fp32"
