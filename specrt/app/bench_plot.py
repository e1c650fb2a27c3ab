"""`specrt bench --plot OUT.png`: tokens/s per system and dataset (grouped bars, the speedup over specrt's plain
decoding written on each) and, for specrt's drafters, the acceptance rate by draft depth. Needs matplotlib (the
`bench` or `dev` extra); it is imported only here."""

from __future__ import annotations

from pathlib import Path

from specrt.errors import SpecrtError


def _label(r: dict) -> str:
    system = "" if r["system"] == "specrt" else r["system"] + "\n"
    return f"{system}{'plain' if r['drafter'] == 'none' else r['drafter']}\n{r['precision']}"


def plot_report(report: dict, out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SpecrtError("--plot needs matplotlib: pip install 'specrt[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if "error" not in r]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    systems = list(dict.fromkeys((r["system"], r["drafter"], r["precision"]) for r in rows))
    fig, (bars, depth) = plt.subplots(2, 1, figsize=(max(9, 0.8 * len(systems) + 2), 9),
                                      gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8 / max(1, len(datasets))
    for j, dataset in enumerate(datasets):
        by_key = {(r["system"], r["drafter"], r["precision"]): r for r in rows if r["dataset"] == dataset}
        xs = [i + (j - (len(datasets) - 1) / 2) * width for i in range(len(systems))]
        speeds = [by_key[k]["tokens_per_second"] if k in by_key else 0.0 for k in systems]
        bars.bar(xs, speeds, width=width, label=dataset, color=f"C{j}")
        for x, k, v in zip(xs, systems, speeds):
            if k in by_key:
                bars.text(x, v, f"{by_key[k]['speedup']:.2f}x", ha="center", va="bottom", fontsize=6, rotation=90)
    bars.set_xticks(range(len(systems)), [_label({"system": s, "drafter": d, "precision": p}) for s, d, p in systems],
                    fontsize=7)
    bars.set_ylabel("tokens/s (median over prompts)")
    bars.set_title(f"{report['max_new_tokens']} new tokens per prompt; speedup vs specrt plain at that precision",
                   fontsize=9)
    if datasets:
        bars.legend(fontsize=8)
    drew = False
    for r in rows:
        acc = r.get("acceptance_by_position") or []
        if acc and r["system"] == "specrt":
            depth.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{r['drafter']} {r['precision']} {r['dataset']}")
            drew = True
    deepest = max((len(r.get("acceptance_by_position") or []) for r in rows), default=0)
    depth.set_xticks(range(1, deepest + 1))
    depth.set_xlabel("draft depth")
    depth.set_ylabel("accepted / drafted at that depth")
    depth.set_ylim(0, 1)
    if drew:
        depth.legend(fontsize=7, ncol=3)
    m = report.get("machine") or {}
    fig.suptitle(f"specrt bench {report['model']}" + (f" ({m.get('cpu')}, {m.get('cores')} cores)" if m else ""),
                 fontsize=10)
    fig.tight_layout()
    tmp = Path(out).with_name(f".{Path(out).name}.partial.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
