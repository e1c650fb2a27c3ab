"""`specrt bench --plot OUT.png`: tokens/s per system and precision (bars, with the speedup over plain decoding
written on each) and, for every drafter, the acceptance rate by draft depth. Needs matplotlib (the `bench` or
`dev` extra); it is imported only here."""

from __future__ import annotations

from pathlib import Path

from specrt.errors import SpecrtError


def plot_report(report: dict, out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SpecrtError("--plot needs matplotlib: pip install 'specrt[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    fig, (bars, depth) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r['drafter']}\n{r['precision']}" for r in rows]
    speeds = [r["tokens_per_second"] for r in rows]
    colors = [f"C{['fp32', 'fp16', 'int4'].index(r['precision']) if r['precision'] in ('fp32', 'fp16', 'int4') else 3}"
              for r in rows]
    bars.bar(range(len(rows)), speeds, color=colors)
    for i, r in enumerate(rows):
        bars.text(i, speeds[i], f"{r['speedup']:.2f}x", ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(len(rows)), labels, fontsize=8)
    bars.set_ylabel("tokens/s (median over prompts)")
    bars.set_title(f"{report.get('dataset', 'prompts')}: {report['prompts']} prompts x {report['max_new_tokens']} tokens",
                   fontsize=9)
    for r in rows:
        acc = r.get("acceptance_by_position") or []
        if acc:
            depth.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{r['drafter']} {r['precision']}")
    deepest = max((len(r.get("acceptance_by_position") or []) for r in rows), default=0)
    depth.set_xticks(range(1, deepest + 1))
    depth.set_xlabel("draft depth")
    depth.set_ylabel("accepted / drafted at that depth")
    depth.set_ylim(0, 1)
    if any(r.get("acceptance_by_position") for r in rows):
        depth.legend(fontsize=8)
    m = report.get("machine") or {}
    fig.suptitle(f"specrt bench {report['model']}" + (f" ({m.get('cpu')}, {m.get('cores')} cores)" if m else ""),
                 fontsize=10)
    fig.tight_layout()
    tmp = Path(out).with_name(f".{Path(out).name}.partial.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
