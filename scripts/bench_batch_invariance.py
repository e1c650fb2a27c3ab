"""Does an int4 bundle give the same logits however tokens are grouped into calls? (docs/perf.md)

Copies the bundle's graph with MatMulNBits' accuracy_level set to LEVEL, feeds 30 random tokens, then 10 more
one by one, as one chunk and as chunks of 4, 4, 2, and prints the largest logit differences and the time of a
1-token and a 5-token call.  Usage: python scripts/bench_batch_invariance.py BUNDLE LEVEL
"""

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from specrt.bundle import load_bundle
from specrt.runtime.target_session import TargetSession, TargetSpec


def main(bundle: str, level: int) -> None:
    man = load_bundle(bundle, check_hashes=False)
    model = onnx.load(str(Path(bundle) / man.target.file), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = level
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save_model(model, f"{tmp}/target.onnx")
        shutil.copyfile(Path(bundle) / man.target.data_file, Path(tmp) / man.target.data_file)  # ORT refuses links
        spec = TargetSpec(man.kv.layers, man.kv.kv_heads, man.kv.head_dim, 512, man.vocab_size)
        s = TargetSession(f"{tmp}/target.onnx", spec)
        ids = np.random.default_rng(0).integers(0, man.vocab_size, size=(1, 40))
        s.forward(ids[:, :30])
        one = np.stack([s.forward(ids[:, 30 + i:31 + i])[0, -1] for i in range(10)])
        s.rollback(30)
        chunk = s.forward(ids[:, 30:40])[0]
        s.rollback(30)
        pieces = np.concatenate([s.forward(ids[:, a:b])[0] for a, b in ((30, 34), (34, 38), (38, 40))])

        def timed(n: int) -> float:
            t = time.perf_counter()
            for _ in range(20):
                s.rollback(30)
                s.forward(ids[:, 30:30 + n])
            return (time.perf_counter() - t) / 20 * 1000

        print(f"level {level}: max|one-by-one - chunk10| {np.abs(one - chunk).max():.2e}  "
              f"max|chunk10 - chunks 4,4,2| {np.abs(chunk - pieces).max():.2e}  "
              f"1-token {timed(1):.1f} ms  5-token {timed(5):.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
