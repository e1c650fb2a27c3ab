"""Plot an EAGLE-3 training curve from `specrt train-drafter` logs (one or more, in order: resumed runs
continue the step count) into a PNG: KL loss per step (and its 25-step mean) and the training batches'
top-1 agreement at draft steps 1..3. Needs matplotlib (not a specrt dependency).

usage: python scripts/plot_training.py OUT.png LOG [LOG ...] [--held-back 0.30,0.27,0.25 ...]
"""

from __future__ import annotations

import argparse
import re

import numpy as np

LINE = re.compile(r"^step (\d+)/\d+ loss ([\d.]+) top-1 by step \[([^\]]*)\]")
HELD = re.compile(r"^step (\d+): held-back top-1 by draft step \[([^\]]*)\]")  # logged at each checkpoint


def read_held_back(paths: list[str]) -> list[str]:
    """Held-back agreement lines as --held-back arguments (STEP:A1,A2,A3)."""
    out = []
    for path in paths:
        for line in open(path, encoding="utf-8"):
            m = HELD.match(line.strip())
            if m:
                out.append(f"{m.group(1)}:{m.group(2).replace(' ', '')}")
    return out


def read_logs(paths: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps, losses, agree = [], [], []
    for path in paths:
        for line in open(path, encoding="utf-8"):
            m = LINE.match(line.strip())
            if m:
                steps.append(int(m.group(1)))
                losses.append(float(m.group(2)))
                agree.append([float(x) for x in m.group(3).split(",")])
    order = np.argsort(steps, kind="stable")
    return np.array(steps)[order], np.array(losses)[order], np.array(agree)[order]


def running_mean(x: np.ndarray, n: int) -> np.ndarray:
    return np.convolve(x, np.ones(n) / n, mode="valid")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--held-back", action="append", default=[], metavar="STEP:A1,A2,A3",
                    help="held-back top-1 agreement by draft step, measured at a training step")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, losses, agree = read_logs(args.logs)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(steps, losses, color="0.8", lw=0.8, label="KL per batch")
    n = 25
    ax1.plot(steps[n - 1:], running_mean(losses, n), color="C0", label=f"{n}-step mean")
    ax1.set_xlabel("optimizer step (batch 4 x 256 tokens)")
    ax1.set_ylabel("KL(target || head), 3 unrolled steps")
    ax1.legend()
    for d in range(agree.shape[1]):
        ax2.plot(steps[n - 1:], running_mean(agree[:, d], n), color=f"C{d}", label=f"draft step {d + 1} (train batches)")
    for item in args.held_back + read_held_back(args.logs):
        at, values = item.split(":")
        for d, v in enumerate(float(x) for x in values.split(",")):
            ax2.scatter([int(at)], [v], color=f"C{d}", marker="x", s=60, zorder=3)
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("top-1 agreement with the target")
    ax2.set_title("x: held-back data", fontsize=9)
    ax2.legend(fontsize=8)
    fig.suptitle("EAGLE-3 head for SmolLM2-135M-Instruct, trained on this CPU with specrt train-drafter")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"{len(steps)} steps -> {args.out}")


if __name__ == "__main__":
    main()
