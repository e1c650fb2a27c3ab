"""Time one DFlash drafter call of a bundle's dflash.onnx (block 8, 2 new context positions, 300 cached),
50 calls after 5 warm-up calls on 2 threads, and with --profile list its slowest MatMul nodes (profiling
slows every call, so time without it).

    python scripts/dflash_recipe/time_drafter_call.py BUNDLE [--profile]
"""

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def main(bundle: str, profile: bool) -> None:
    entry = next(d for d in json.loads((Path(bundle) / "specrt.json").read_text())["drafters"] if d["kind"] == "dflash")
    kv, block = entry["kv"], entry["block_size"]
    width = len(entry["target_layer_ids"]) * entry["target_hidden_size"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.enable_profiling = profile
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "dflash")
    session = ort.InferenceSession(str(Path(bundle) / entry["graph"]["file"]), options,
                                   providers=["CPUExecutionProvider"])
    past = np.zeros((1, kv["kv_heads"], 300, kv["head_dim"]), np.float32)
    feeds = {"input_ids": np.array([[5] + [entry["mask_token_id"]] * (block - 1)]),
             "features": np.random.default_rng(0).normal(size=(1, 2, width)).astype(np.float32),
             "position_ids": np.arange(300, 302 + block)[None]}
    feeds.update({f"past_key_values.{i}.{n}": past for i in range(kv["layers"]) for n in ("key", "value")})
    for _ in range(5):
        session.run(None, feeds)
    t, calls = time.perf_counter(), 50
    for _ in range(calls):
        session.run(None, feeds)
    print(f"{bundle}: {(time.perf_counter() - t) / calls * 1e3:.2f} ms per call "
          f"(draft vocabulary {entry.get('draft_vocab_size', entry['vocab_size'])})")
    if profile:
        trace = Path(session.end_profiling())
        events = json.loads(trace.read_text())
        trace.unlink()
        nodes = collections.Counter()
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["args"]["op_name"] == "MatMul":
                nodes[e["name"]] += e["dur"] / (calls + 5) / 1e3
        for name, ms in nodes.most_common(3):
            print(f"  {name}: {ms:.2f} ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", metavar="BUNDLE")
    ap.add_argument("--profile", action="store_true", help="list the slowest MatMul nodes (slows every call)")
    args = ap.parse_args()
    main(args.bundle, args.profile)
