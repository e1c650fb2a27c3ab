"""Two ways to keep the recurrent state of an accepted prefix after a speculative verification call, measured on one
Gated DeltaNet layer at Qwen3.5-9B's widths (16 key heads, 32 value heads of 128: a 2 MiB state), for calls of
S = 1..8 tokens, times the model's linear layers (24 of 32 at 9B):

  capture + replay   one GatedDeltaNet call over the S tokens with its compact state-update capture (decay, key,
                     delta per token), then, when only `kept` < S tokens are accepted, the state rebuilt from the
                     state before the call (runtime/recurrent_state.py, one pass over the state)
  per-position       the S tokens through S chained one-token GatedDeltaNet calls in one graph, each writing its
                     state out (ONNX Runtime's CPU LinearAttention refuses state_window > 0, so this is how a CPU
                     graph outputs every position's state), then a copy of the kept position's state

    python scripts/bench_state_keep.py [--layers 24] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.append(str(Path(__file__).resolve().parents[1]))

HK, HV, D = 16, 32, 128
CAPACITY = 8


def _session(graph):
    """A CPU session over a one-graph model (opset 21 + com.microsoft)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _inputs(s: int):
    f = TensorProto.FLOAT
    return [helper.make_tensor_value_info("q", f, [1, s, HK, D]), helper.make_tensor_value_info("k", f, [1, s, HK, D]),
            helper.make_tensor_value_info("v", f, [1, s, HV, D]), helper.make_tensor_value_info("a", f, [1, s, HV]),
            helper.make_tensor_value_info("b", f, [1, s, HV]), helper.make_tensor_value_info("state", f, [1, HV, D, D])]


def capture_graph(s: int):
    f = TensorProto.FLOAT
    count = helper.make_tensor("count", TensorProto.INT32, [1], [CAPACITY])
    node = helper.make_node("GatedDeltaNet", ["q", "k", "v", "", "a", "b", "state", "", "", "count"],
                            ["out", "final", "capture"], domain="com.microsoft", state_update_capacity=CAPACITY)
    graph_inputs = _inputs(s)
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "final", "capture")]
    return _session(helper.make_graph([node], "g", graph_inputs, outputs, [count]))


def per_position_graph(s: int):
    f = TensorProto.FLOAT
    nodes, outputs, state = [], [], "state"
    for t in range(s):
        for name in ("q", "k", "v", "a", "b"):
            nodes.append(helper.make_node("Slice", [name, f"lo{t}", f"hi{t}", "axis1"], [f"{name}{t}"]))
        nodes.append(helper.make_node("GatedDeltaNet", [f"q{t}", f"k{t}", f"v{t}", "", f"a{t}", f"b{t}", state],
                                      [f"out{t}", f"state{t}"], domain="com.microsoft"))
        state = f"state{t}"
        outputs.append(helper.make_tensor_value_info(state, f, None))
    consts = [helper.make_tensor("axis1", TensorProto.INT64, [1], [1])]
    for t in range(s):
        consts += [helper.make_tensor(f"lo{t}", TensorProto.INT64, [1], [t]),
                   helper.make_tensor(f"hi{t}", TensorProto.INT64, [1], [t + 1])]
    return _session(helper.make_graph(nodes, "g", _inputs(s), outputs, consts))


def main() -> None:
    from specrt.bundle import RecurrentStates
    from specrt.kernels.state_replay import replay_recurrent

    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    layout = RecurrentStates(layers=(0,), conv_kernel=4, conv_channels=2 * HK * D + HV * D, value_heads=HV,
                             value_dim=D, key_heads=HK, key_dim=D)
    print("| tokens S | capture call | + replay of S - 1 kept | per-position call | + copy of the kept state | "
          "capture+replay / per-position (x layers: ms) |")
    print("|---|---|---|---|---|---|")
    for s in (1, 2, 3, 4, 5, 8):
        feeds = {"q": rng.standard_normal((1, s, HK, D), np.float32) * 0.1,
                 "k": rng.standard_normal((1, s, HK, D), np.float32) * 0.1,
                 "v": rng.standard_normal((1, s, HV, D), np.float32),
                 "a": rng.standard_normal((1, s, HV), np.float32),
                 "b": rng.standard_normal((1, s, HV), np.float32),
                 "state": rng.standard_normal((1, HV, D, D), np.float32) * 0.1}
        cap, per = capture_graph(s), per_position_graph(s)
        t_cap, t_replay, t_per, t_copy = [], [], [], []
        dst = np.empty((1, HV, D, D), np.float32)
        for r in range(args.reps + 2):
            t = time.perf_counter()
            out = cap.run(None, feeds)
            t1 = time.perf_counter()
            replay_recurrent(feeds["state"], out[2], max(s - 1, 0), layout.capacity, layout.key_heads, dst)
            t2 = time.perf_counter()
            states = per.run(None, feeds)
            t3 = time.perf_counter()
            dst[...] = states[-2] if s > 1 else states[-1]
            t4 = time.perf_counter()
            if r >= 2:
                t_cap.append(t1 - t), t_replay.append(t2 - t1), t_per.append(t3 - t2), t_copy.append(t4 - t3)
        med = [1000 * statistics.median(x) for x in (t_cap, t_replay, t_per, t_copy)]
        n = args.layers
        print(f"| {s} | {med[0]:.3f} | {med[1]:.3f} | {med[2]:.3f} | {med[3]:.3f} | "
              f"{(med[0] + med[1]) * n:.1f} / {(med[2] + med[3]) * n:.1f} |", flush=True)


if __name__ == "__main__":
    main()
