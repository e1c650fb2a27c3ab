"""Step time of target graphs: specrt's bundle vs onnxruntime-genai's model builder, side by side.

For each past length P and number of new tokens S, every graph runs the same call (S tokens on top
of a cache holding P) with its KV cache preallocated and bound in place (past/present share one
buffer, as both runtimes do). Calls are interleaved across graphs so machine noise hits all alike.
Usage:
    python scripts/bench_target_step.py --graph specrt-fp32=BUNDLE/target.onnx \
        --graph genai-fp32=GENAI_DIR/model.onnx ... [--past 64,512,2048] [--new 1,2,4,8,16] [--reps 15]
Prints a markdown table of median milliseconds and writes JSON with --json. --session-config NAME:KEY=VALUE adds an
ONNX Runtime session config entry to graph NAME (the same file may run under two names, e.g. with and without
mlas.use_lut_gemm). --exact NAME runs graph NAME's calls exact (batch-invariant mode: attention on at least two rows,
an MoE's experts one token at a time), as specrt does with --batch-invariant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime as ort

from specrt.runtime.target_session import make_session_options


class GraphRunner:
    """Binds whatever inputs a decoder graph declares; KV buffers of max_len shared past/present."""

    def __init__(self, path: str, max_len: int, head_dim: int, config: dict[str, str] | None = None,
                 random_ids: bool = False, exact: bool = False):
        self.exact = exact
        self.rng = np.random.default_rng(0) if random_ids else None  # distinct tokens: an MoE routes each its own way
        opts = make_session_options(model_path=path)
        for key, value in (config or {}).items():
            opts.add_session_config_entry(key, value)
        self.sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.sess.get_inputs()}
        kv = [i for i in self.sess.get_inputs() if i.name.startswith("past_key_values")]
        self.binding = self.sess.io_binding()
        for inp in kv:
            _, heads, _, dim = inp.shape
            dim = dim if isinstance(dim, int) else head_dim  # genai names it symbolically
            buf = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, heads, max_len, dim), np.float32))
            self.binding.bind_ortvalue_input(inp.name, buf)
            self.binding.bind_ortvalue_output(inp.name.replace("past_key_values", "present"), buf)
        self.captures = []
        for inp in self.sess.get_inputs():  # hybrids (Qwen3.5): conv and recurrent states, read and written apart
            if inp.name.startswith(("past_conv.", "past_recurrent.")):
                shape = [1, *inp.shape[1:]]
                self.binding.bind_ortvalue_input(inp.name, ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32)))
                self.binding.bind_ortvalue_output(inp.name.replace("past_", "present_"),
                                                  ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32)))
        self.captures = [o.name for o in self.sess.get_outputs() if o.name.startswith("capture_")]
        self.binding.bind_output("logits")

    def step(self, past: int, new: int) -> float:
        total = past + new
        feeds = {
            "input_ids": (np.full((1, new), 42, np.int64) if self.rng is None
                          else self.rng.integers(100, 30000, size=(1, new), dtype=np.int64)),
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": np.arange(past, total, dtype=np.int64)[None],
            "attention_bias": np.zeros((1, 1, new, total), np.float32),
            "sliding_attention_bias": np.zeros((1, 1, new, total), np.float32),  # Gemma 3/4 (the window unmasked)
            # specrt graphs: calls as plain decoding makes them, or exact ones (convert/attention_rows.py, moe_graph.py)
            "attention_min_rows": np.full(1, 2 if self.exact else 1, np.int64),
            "experts_token_by_token": np.full(1, int(self.exact), np.int64),
        }
        for name, value in feeds.items():
            if name in self.inputs:
                self.binding.bind_cpu_input(name, value)
        self.binding.bind_output("logits")  # unallocated again: its shape changes with `new`
        for name in self.captures:
            self.binding.bind_output(name)
        t = time.perf_counter()
        self.sess.run_with_iobinding(self.binding)
        outs = self.binding.get_outputs()  # logits (and a hybrid's captures) reach the host, as a decode loop needs
        for value in outs[-1 - len(self.captures):]:
            value.numpy()
        return (time.perf_counter() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", action="append", required=True, help="NAME=PATH of an .onnx decoder graph")
    ap.add_argument("--past", default="64,512,2048")
    ap.add_argument("--new", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per block")
    ap.add_argument("--rounds", type=int, default=3, help="blocks per graph, alternating graphs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--session-config", action="append", default=[], help="NAME:KEY=VALUE for graph NAME")
    ap.add_argument("--head-dim", type=int, default=64, help="for graphs that leave the KV head dim symbolic")
    ap.add_argument("--exact", action="append", default=[], help="NAME: graph NAME runs exact (batch-invariant) calls")
    ap.add_argument("--random-ids", action="store_true",
                    help="new tokens drawn at random (default: all token 42, which an MoE routes alike)")
    args = ap.parse_args()
    pasts = [int(x) for x in args.past.split(",")]
    news = [int(x) for x in args.new.split(",")]
    configs: dict[str, dict[str, str]] = {}
    for entry in args.session_config:
        name, _, pair = entry.partition(":")
        key, _, value = pair.partition("=")
        configs.setdefault(name, {})[key] = value
    runners = {}
    for spec in args.graph:
        name, path = spec.split("=", 1)
        runners[name] = GraphRunner(path, max(pasts) + max(news) + 1, args.head_dim, configs.get(name),
                                    args.random_ids, name in args.exact)
    results = {}
    for past in pasts:
        for new in news:
            times = {name: [] for name in runners}
            for name, r in runners.items():  # warm-up
                r.step(past, new)
            # blocks of calls per graph, alternating graphs between blocks: interleaving single calls
            # lets one session's spinning worker threads steal the 2 cores from the next session
            for _ in range(args.rounds):
                for name, r in runners.items():
                    r.step(past, new)
                    times[name].extend(r.step(past, new) for _ in range(args.reps))
            for name in runners:
                results[(name, past, new)] = statistics.median(times[name])
    header = "| graph | past | " + " | ".join(f"{n} new" for n in news) + " |"
    print(header)
    print("|" + "---|" * (2 + len(news)))
    for past in pasts:
        for name in runners:
            row = " | ".join(f"{results[(name, past, n)]:.1f}" for n in news)
            print(f"| {name} | {past} | {row} |")
    if news[0] == 1:  # the cost of verifying k tokens, in single steps: what speculation must beat
        print("\n| graph | past | " + " | ".join(f"{n} new / 1 new" for n in news[1:]) + " |")
        print("|" + "---|" * (1 + len(news)))
        for past in pasts:
            for name in runners:
                base = results[(name, past, 1)]
                row = " | ".join(f"{results[(name, past, n)] / base:.2f}" for n in news[1:])
                print(f"| {name} | {past} | {row} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"graph": k[0], "past": k[1], "new": k[2], "ms": v} for k, v in results.items()], f, indent=1)


if __name__ == "__main__":
    main()
