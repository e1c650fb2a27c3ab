"""Time `specrt convert` of a model at each precision (source already in the cache), one run each.

Usage: python scripts/bench_convert.py [MODEL] [OUT_ROOT]  -> prints a markdown table
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("out_root", nargs="?", default="bench-out")
    args = ap.parse_args()
    model, root = args.model, Path(args.out_root)
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["specrt", "convert", model, "-o", str(root / "warm"), "--force", "--max-context", "64"],
                   check=True, capture_output=True)  # fetch the source once, outside the timing
    print("| model | precision | convert wall time (s) |\n|---|---|---|")
    for precision in ("fp32", "int4"):
        t = time.perf_counter()
        subprocess.run(["specrt", "convert", model, "-o", str(root / precision), "--precision", precision, "--force"],
                       check=True, capture_output=True)
        print(f"| {model} | {precision} | {time.perf_counter() - t:.1f} |", flush=True)


if __name__ == "__main__":
    main()
