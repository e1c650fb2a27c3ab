"""How many distinct experts a verification of k tokens reads per MoE layer, on a converted bundle.

    python scripts/moe_experts_touched.py BUNDLE [--tokens 256] [--k 1,2,3,4,5,6,7,8] [--json OUT]

A copy of the bundle's target graph (beside it, sharing its data file, deleted afterwards) also outputs every MoE
layer's router logits. One call over a text's tokens gives each token's routing as decoding would (the routing
depends only on the token and what precedes it); a verification call of k tokens reads the union of its k
tokens' top-k experts, counted here for every window of k consecutive tokens and averaged over windows and
layers. Random-weight models route nearly at random (the worst case for MoE speculation); a trained model's
consecutive tokens share more experts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx

TEXT = ("The history of the bicycle begins in the early nineteenth century, when inventors in Europe tried to build "
        "a machine that a person could ride without a horse. The first designs had no pedals at all: the rider "
        "pushed the ground with both feet. Later, pedals were fixed to the front wheel, and finally a chain drove "
        "the rear wheel, which made the modern safety bicycle. Today bicycles carry people to work, to school and "
        "around the world, and engineers still improve their frames, gears and brakes. ") * 4


def router_twin(target: Path) -> tuple[Path, list[str]]:
    """The graph with each MoE / QMoE node's router logits as extra outputs; returns its path and their names."""
    from specrt.convert.moe_graph import router_logits_name
    from specrt.convert.onnx_graph import walk_nodes

    model = onnx.load(str(target), load_external_data=False)
    suffix = router_logits_name(0).removeprefix("layers.0")
    names = [o for n in model.graph.node for o in n.output if o.endswith(suffix)]
    if not names:  # graphs converted before the router logits were named: the op's own input
        names = [n.input[1] for n in walk_nodes(model.graph) if n.op_type in ("MoE", "QMoE")]
    for name in names:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    twin = target.with_name(target.stem + ".routers.onnx")
    onnx.save_model(model, str(twin))
    return twin, names


def main() -> None:
    import onnxruntime as ort

    from tokenizers import Tokenizer

    from specrt.bundle import load_bundle
    from specrt.models.config import ModelConfig
    from specrt.runtime.target_session import make_session_options

    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--k", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    manifest = load_bundle(args.bundle)
    cfg = ModelConfig.from_dict(manifest.model_config)
    top_k, experts = cfg.experts_per_token, cfg.num_experts
    ids = Tokenizer.from_file(str(args.bundle / "tokenizer.json")).encode(TEXT).ids[: args.tokens]
    twin, names = router_twin(args.bundle / manifest.target.file)
    try:
        session = ort.InferenceSession(str(twin), make_session_options(), providers=["CPUExecutionProvider"])
        n = len(ids)
        feeds = {"input_ids": np.array([ids], np.int64), "position_ids": np.arange(n, dtype=np.int64)[None],
                 "attention_mask": np.ones((1, n), np.int64), "attention_bias": np.zeros((1, 1, n, n), np.float32),
                 "attention_min_rows": np.ones(1, np.int64), "experts_token_by_token": np.zeros(1, np.int64)}
        for inp in session.get_inputs():
            if inp.name.startswith("past_") or inp.name == "sliding_attention_bias":
                shape = [1 if not isinstance(d, int) else d for d in inp.shape]
                if inp.name.startswith("past_key_values"):
                    shape[2] = 0
                feeds[inp.name] = np.zeros(shape, np.float32)
        feeds = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
        logits = session.run(names, feeds)  # per MoE layer [n, E]
    finally:
        twin.unlink()
    chosen = [np.argsort(-layer, axis=-1)[:, :top_k] for layer in logits]  # per layer [n, top_k]
    rows = []
    for k in (int(x) for x in args.k.split(",")):
        counts = [len(np.unique(c[s:s + k])) for c in chosen for s in range(0, n - k + 1)]
        rows.append({"k": k, "distinct_experts": float(np.mean(counts)), "of": experts,
                     "vs_one_token": float(np.mean(counts)) / top_k})
    print(f"{args.bundle}: {len(chosen)} MoE layers, {experts} experts, top-{top_k}, {n} tokens of text")
    print("| k | distinct experts per layer | x one token's |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['distinct_experts']:.1f} of {experts} | {r['vs_one_token']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
