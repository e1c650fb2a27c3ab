"""Where a target graph's step spends its time: ONNX Runtime's own per-node profile, summed by op type and by node.

Runs one graph's calls (S new tokens on top of a cache of P, KV bound in place as scripts/bench_target_step.py binds
it) with profiling on, then sums each node's kernel time over the timed calls and prints two tables: by op type, and
by node name with its layer number taken out (layers.7.mlp.down_proj -> layers.*.mlp.down_proj), so a layer kind's
cost is one row. Times are per call (milliseconds); the profile's own overhead inflates them a little, so compare
shares, and read absolute step times from bench_target_step.py.
Usage:
    python scripts/profile_step.py BUNDLE/target.onnx [--past 512] [--new 1] [--calls 20] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_target_step import GraphRunner  # noqa: E402


def node_events(profile_path: str) -> list[tuple[str, str, float]]:
    """(node name, op type, microseconds) for every kernel run in the profile."""
    with open(profile_path) as f:
        events = json.load(f)
    out = []
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            out.append((e["name"][: -len("_kernel_time")], e.get("args", {}).get("op_name", "?"), float(e["dur"])))
    return out


def layer_pattern(name: str) -> str:
    """The node's name with layer numbers taken out: one row per layer kind."""
    return re.sub(r"(layers?[._/])\d+", r"\1*", name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph", help="an .onnx decoder graph (a bundle's target.onnx)")
    ap.add_argument("--past", type=int, default=512)
    ap.add_argument("--new", type=int, default=1)
    ap.add_argument("--calls", type=int, default=20, help="profiled calls after 3 warm-up calls")
    ap.add_argument("--top", type=int, default=25, help="rows of the by-node table")
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()

    prefix = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"specrt-profile-{os.getpid()}")
    os.environ["SPECRT_PROFILE_PREFIX"] = prefix  # make_session_options turns profiling on (runtime/target_session.py)
    runner = GraphRunner(args.graph, args.past + args.new + 1, args.head_dim)
    for _ in range(3):
        runner.step(args.past, args.new)
    walls = [runner.step(args.past, args.new) for _ in range(args.calls)]
    path = runner.sess.end_profiling()
    events = node_events(path)
    os.unlink(path)
    runs = len(walls) + 3  # the profile holds the warm-up calls too
    by_type: collections.Counter = collections.Counter()  # op type -> microseconds
    by_node: collections.Counter = collections.Counter()  # (node name with layers as *, op type) -> microseconds
    count: collections.Counter = collections.Counter()  # the same key -> kernel runs
    for name, op, us in events:
        key = (layer_pattern(name), op)
        by_type[op] += us
        by_node[key] += us
        count[key] += 1
    total = sum(by_type.values())
    wall = sorted(walls)[len(walls) // 2]
    print(f"{args.graph}: past {args.past}, new {args.new}; median call {wall:.2f} ms (profiled), "
          f"kernels {total / runs / 1000:.2f} ms a call")
    print("\n| op type | ms a call | share |\n|---|---|---|")
    for op, us in sorted(by_type.items(), key=lambda kv: -kv[1]):
        if us / total >= 0.002:
            print(f"| {op} | {us / runs / 1000:.3f} | {100 * us / total:.1f} % |")
    print("\n| node (layers as *) | op | nodes a call | ms a call | share |\n|---|---|---|---|---|")
    for (pattern, op), us in sorted(by_node.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {pattern} | {op} | {count[(pattern, op)] // runs} | {us / runs / 1000:.3f} | "
              f"{100 * us / total:.1f} % |")


if __name__ == "__main__":
    main()
