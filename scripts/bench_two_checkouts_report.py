"""Compare the interleaved `specrt bench` runs scripts/bench_two_checkouts.sh wrote: per row (precision, drafter),
the median tokens/s of each side over its runs, NEW / OLD, and whether the two sides' mean accepted tokens and
token outputs agree. Usage: python scripts/bench_two_checkouts_report.py OUT"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def rows(path: Path) -> dict:
    report = json.loads(path.read_text())
    return {(r["precision"], r["drafter"]): r for r in report["results"] if "error" not in r}


def main(out: Path) -> None:
    sides = {side: [rows(p) for p in sorted(out.glob(f"{side}-*.json"))] for side in ("old", "new")}
    keys = sorted(set().union(*sides["old"], *sides["new"]))
    print(f"CPU flags: {(out / 'cpu_flags.txt').read_text().strip()}; runs per side: "
          f"{len(sides['old'])} old, {len(sides['new'])} new")
    print("| precision | drafter | old tok/s (runs) | new tok/s (runs) | new / old | mean accepted old / new |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key in keys:
        tps = {s: [r[key]["tokens_per_second"] for r in sides[s] if key in r] for s in sides}
        acc = {s: [r[key]["mean_accepted"] for r in sides[s] if key in r] for s in sides}
        if not tps["old"] or not tps["new"]:
            continue
        old, new = statistics.median(tps["old"]), statistics.median(tps["new"])
        runs = {s: " / ".join(f"{t:.1f}" for t in tps[s]) for s in tps}
        print(f"| {key[0]} | {key[1]} | {old:.1f} ({runs['old']}) | {new:.1f} ({runs['new']}) | {new / old:.3f} | "
              f"{statistics.median(acc['old']):.3f} / {statistics.median(acc['new']):.3f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
