"""`specrt convert TARGET --drafter assistant:FOLDER`: Gemma 4's assistant drafter (HF Gemma4AssistantForCausalLM,
a safetensors folder) into the bundle.

The checkpoint is checked against the target (backbone width, vocabulary, the head sizes and KV heads of the
target layers it reads: models/gemma4_assistant.py), exported to assistant.onnx (convert/assistant_graph.py; int4
or int8 beside a target of that precision, else fp32) and validated against its torch definition over target-like
caches. The target graph then emits the residual stream after its last layer (the assistant's first step reads the
target's final-normed hidden state of the token before the newest).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from specrt.bundle import TargetGraph, checkpoint_sha256
from specrt.models.tensor_source import WeightSource, rows_of, shape_of

STEM = "assistant"


def check(arg: str, precision: str) -> None:
    """Nothing to refuse before work starts beyond the checkpoint folder (convert/drafter_bundle.py checks it)."""


def stages(arg: str) -> int:
    return 2  # build, validate


def load(folder: Path, target):
    """(AssistantConfig, its tensors as TensorRefs) of an assistant folder, checked against the target config."""
    from specrt.models.checkpoint_folder import check_tensors, open_checkpoint, tensor_refs
    from specrt.models.gemma4_assistant import assistant_config_from_hf, expected_shapes

    hf, files = open_checkpoint(folder, "a Gemma 4 assistant checkpoint folder")
    cfg = assistant_config_from_hf(hf, target, str(folder))
    refs = tensor_refs(files, lambda name: name)
    check_tensors(folder, refs, expected_shapes(cfg), "Gemma 4 assistant checkpoint", optional={"lm_head.weight"})
    return cfg, refs


def hidden_layers_for(arg: str, loaded) -> tuple[int, ...]:
    """The target's last layer (whose residual stream, final-normed, the first draft step reads)."""
    load(Path(arg).expanduser(), loaded.config)
    return (loaded.config.num_layers - 1,)


class _Weights(WeightSource):
    """The assistant's tensors (TensorRefs, read when used) plus the target's embedding table and final norm, under
    the graph's names; rows and shapes without reading a whole table (a 262144-token table is read in chunks)."""

    def __init__(self, refs: dict, target_weights):
        self.refs, self.target = refs, target_weights

    def _target_name(self, name: str) -> str | None:
        from specrt.convert.assistant_graph import TARGET_EMBED, TARGET_NORM

        return {TARGET_EMBED: "model.embed_tokens.weight", TARGET_NORM: "model.norm.weight"}.get(name)

    def __getitem__(self, name):
        target = self._target_name(name)
        return self.target[target] if target else self.refs[name].read()

    def __iter__(self):
        from specrt.convert.assistant_graph import TARGET_EMBED, TARGET_NORM

        return iter([*self.refs, TARGET_EMBED, TARGET_NORM])

    def __len__(self) -> int:
        return len(self.refs) + 2

    def __contains__(self, name) -> bool:
        return name in self.refs or self._target_name(name) is not None

    def rows(self, name: str, ids):
        target = self._target_name(name)
        return rows_of(self.target, target, ids) if target else self.refs[name].read_rows(np.asarray(ids))

    def shape(self, name: str) -> tuple[int, ...]:
        target = self._target_name(name)
        return tuple(shape_of(self.target, target)) if target else tuple(self.refs[name].shape)


def add(spec: str, arg: str, tmp: Path, loaded, precision: str, max_context: int, providers, stages,
        build_graph=None, *, device: str = "cpu") -> dict:
    """Write the assistant's graph into tmp (in the GPU profile for a GPU target: float16, reading the target's
    float16 cache); returns its manifest entry."""
    from specrt.convert.assistant_graph import INPUTS, AssistantBuilder
    from specrt.convert.gpu_profile import activation_dtype
    from specrt.convert.head_graph import head_precision
    from specrt.convert.target_graph import GraphOptions, write_graph

    folder = Path(arg).expanduser()
    cfg, refs = load(folder, loaded.config)
    weights = _Weights(refs, loaded.weights)
    opts = GraphOptions(precision=head_precision(precision), max_context=max_context, device=device)
    stages.start(f"build {STEM} graph")
    written = write_graph(AssistantBuilder(cfg, weights, opts), tmp, STEM)
    stages.done()
    stages.start(f"validate {STEM}")
    validation = validate(tmp / f"{STEM}.onnx", cfg, weights, written, loaded.config, providers, opts.precision)
    stages.done()
    c = cfg.layer
    graph = TargetGraph(file=f"{STEM}.onnx", data_file=f"{STEM}.onnx.data", precision=opts.precision,
                        inputs=INPUTS, outputs=("logits", "hidden_out"), hidden_size=cfg.backbone_hidden_size)
    return {
        "kind": "assistant", "name": "assistant", "spec": spec, "source": str(folder),
        "source_sha256": checkpoint_sha256(folder), "model_config": c.to_dict(), "graph": dataclasses.asdict(graph),
        # it keeps no cache: kv names the target layers it reads (their caches are the target's)
        "kv": {"layers": len(cfg.readers), "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
               "max_context": max_context, "dtype": activation_dtype(opts.precision, device)},
        "target_layer_ids": list(cfg.readers), "vocab_size": cfg.vocab_size,
        "target_hidden_size": cfg.backbone_hidden_size, "sliding_window": c.sliding_window,
        "ordered_embeddings": cfg.ordered_embeddings, "validation": validation,
    }


class _Rows:
    """table[ids]: only those rows of a weight read (the validation looks a few tokens up in the target's table)."""

    def __init__(self, weights, name: str):
        self.weights, self.name = weights, name

    def __getitem__(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        return np.asarray(rows_of(self.weights, self.name, ids.reshape(-1)), np.float32).reshape(*ids.shape, -1)



def validate(path: Path, cfg, weights, written, target_cfg, providers, precision: str) -> dict:
    """The graph against the torch assistant holding the very same (maybe quantized) weights, over random target
    caches and features: a first step reading the target's features, then two feeding back hidden_out."""
    import torch

    from specrt.convert.assistant_graph import TARGET_EMBED, TARGET_NORM
    from specrt.convert.head_graph import _QuantizedRows, validate_graph
    from specrt.convert.quantize import dequantize
    from specrt.models.gemma4_assistant import Gemma4Assistant

    with torch.device("meta"):
        module = Gemma4Assistant(cfg, target_cfg.rms_norm_eps)
    module.to_empty(device="cpu")
    state = {}
    for name in list(weights.refs) + [TARGET_NORM]:
        if name == "lm_head.weight":
            continue
        key = "target_norm.weight" if name == TARGET_NORM else name
        value = np.asarray(weights[name])
        state[key] = torch.from_numpy(np.array(value, dtype=np.int64 if "token_ordering" in name else np.float32))
    for name in written.quant_rows:  # the torch assistant runs the very quantized weights the graph holds
        if name in (TARGET_EMBED,):
            continue
        key = "model.embed_tokens.weight" if name == "lm_head.weight" else name
        state[key] = torch.from_numpy(dequantize(written.quantized(name)))
    module.load_state_dict(state, strict=False, assign=True)
    for sub in module.modules():
        if hasattr(sub, "rotary_frequencies"):
            sub.inv_freq = sub.rotary_frequencies()
    module.eval().requires_grad_(False)
    embed = (_QuantizedRows(written, TARGET_EMBED) if TARGET_EMBED in written.quant_rows
             else _Rows(weights, TARGET_EMBED))
    validation, _ = validate_graph(path, bool(written.quant_rows), providers,
                                   lambda session: compare(session, module, embed, target_cfg), "assistant", precision)
    return validation


def compare(session, module, embed, target_cfg, seed: int = 0, slots: int = 12) -> float:
    """Max |difference| of logits and hidden_out between the graph and the torch assistant at position `slots`
    over random target caches (a cache of max context 2 * slots, its later slots garbage the graph must not read)."""
    import torch

    cfg = module.cfg
    rng = np.random.default_rng(seed)
    b, window = cfg.backbone_hidden_size, cfg.layer.sliding_window
    # the graph's float type (a GPU graph's float16); torch reads the very values fed, in float32
    dtype = np.float16 if "float16" in next(i.type for i in session.get_inputs() if i.name == "features") \
        else np.float32

    def fed(shape):
        return rng.normal(size=shape).astype(dtype).astype(np.float32)

    feeds, caches = {}, {}
    for i in cfg.readers:
        heads, dim = target_cfg.kv_shape_of(i)
        keys, values = (fed((1, heads, 2 * slots, dim)) for _ in range(2))
        feeds[f"past_key_values.{i}.key"] = keys.astype(dtype)
        feeds[f"past_key_values.{i}.value"] = values.astype(dtype)
        lo = max(0, slots - window - 1) if target_cfg.is_sliding(i) else 0
        caches[i] = (torch.from_numpy(keys[:, :, lo:slots]), torch.from_numpy(values[:, :, lo:slots]))
    hidden, worst = None, 0.0
    token = np.array([[int(rng.integers(0, cfg.vocab_size))]])
    for step in range(3):
        features = fed((1, 1, b))
        use = step == 0
        h_in = hidden if hidden is not None else np.zeros((1, 1, b), np.float32)
        logits, h_out = session.run(None, {**feeds, "input_ids": token, "position_ids": np.array([[slots]]),
                                            "kv_length": np.array([slots]), "features": features.astype(dtype),
                                            "hidden": h_in.astype(dtype), "use_features": np.array([use])})
        h_out = h_out.astype(np.float32)
        with torch.no_grad():
            emb = torch.from_numpy(np.asarray(embed[token], np.float32)) * torch.tensor(np.sqrt(b), dtype=torch.float32)
            t_logits, t_h = module(emb, torch.from_numpy(features) if use else None,
                                   None if use else torch.from_numpy(h_in), torch.tensor([[slots]]), caches)
        worst = max(worst, float(np.abs(logits - t_logits.numpy()).max()), float(np.abs(h_out - t_h.numpy()).max()))
        hidden, token = h_out, logits.argmax(-1)
    return worst
