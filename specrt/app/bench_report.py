"""`specrt bench` results as text: the terminal table and the Markdown table for docs (same rows, same order)."""

from __future__ import annotations

COLUMNS = ("dataset", "system", "drafter", "precision", "tok/s", "range", "mean acc", "acc len", "wasted", "speedup",
           "range", "acceptance by depth", "identical", "steps by drafter")
# mean acc: tokens per target call; acc len: 1 + accepted / drafts (vLLM's and SGLang's mean acceptance length);
# wasted: drafted tokens the target rejected, per target call; steps by drafter: the share of decode steps each
# member drafted (a mix, auto), "none" the steps it decoded plainly; identical: outputs equal to plain decoding's,
# and where some are not, the median token at which outputs first part from it


def _cells(report: dict, r: dict) -> list[str]:
    precision = r["precision"] + (" batch-inv." if r.get("batch_invariant") else "")
    base = [r.get("dataset") or "all", r["system"], r["drafter"], precision]
    if "error" in r:
        return base + [f"not run: {r['error']}"] + [""] * (len(COLUMNS) - 5)
    lo, hi = r.get("tokens_per_second_range", [0, 0])
    acc, length, wasted = r.get("mean_accepted"), r.get("acceptance_length"), r.get("wasted_per_call")
    depth = " / ".join(f"{a:.2f}" for a in r.get("acceptance_by_position", []))
    identical = f"{r['identical_to_plain']}/{r['prompts']}" if "identical_to_plain" in r else ""
    if identical and r["identical_to_plain"] < r["prompts"] and "first_difference" in r:
        identical += f" (from {r['first_difference']:.0f})"
    steps = r.get("steps_by_drafter") or {}
    total = sum(steps.values())
    chose = " / ".join(f"{name} {n / total:.0%}" for name, n in steps.items()) if total else ""
    return base + [f"{r['tokens_per_second']:.1f}", f"{lo:.0f}-{hi:.0f}", "-" if acc is None else f"{acc:.2f}",
                   "-" if length is None else f"{length:.2f}", "-" if wasted is None else f"{wasted:.2f}",
                   f"{r['speedup']:.2f}x", f"{r['min_speedup']:.2f}-{r.get('max_speedup', r['speedup']):.2f}",
                   depth, identical, chose]


def _title(report: dict) -> str:
    m = report.get("machine") or {}
    sets = ", ".join(f"{k} ({n})" for k, n in report.get("datasets", {}).items())
    return (f"{report['model']}, {sets or str(report['prompts']) + ' prompts'}: {report['max_new_tokens']} new tokens, "
            f"temperature {report['temperature']}"
            + (" (identical: outputs equal to specrt plain decoding's)" if report["temperature"] == 0 else "")
            + (f"; draft length {report['draft_length']} (fixed)" if report.get("draft_length") else "")
            + (f"; {report['repeats']} rounds per prompt (mirrored order, pooled)" if report.get("repeats", 1) > 1
               else "")
            + (f"; {m.get('cpu')}, {m.get('cores')} cores, onnxruntime {m.get('onnxruntime')}" if m else ""))


def format_table(report: dict) -> str:
    rows = [list(COLUMNS)] + [_cells(report, r) for r in report["results"]]
    measured = [row for row in rows if not row[4].startswith("not run")]
    widths = [max(len(row[i]) for row in measured) for i in range(len(COLUMNS))]
    lines = [_title(report)]
    for row in rows:
        if row[4].startswith("not run"):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        else:
            lines.append("  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                         .rstrip())
    return "\n".join(lines)


def format_markdown(report: dict, command: str = "") -> str:
    """The results as a Markdown table, with the command and the machine above it."""
    lines = [f"`{command}`", ""] if command else []
    lines += [_title(report), ""]
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for r in report["results"]:
        lines.append("| " + " | ".join(_cells(report, r)) + " |")
    versions = sorted({(r["system"], r["version"]) for r in report["results"] if r.get("version")})
    if versions:
        lines += ["", "Versions: " + ", ".join(f"{s} {v}" for s, v in versions)]
    return "\n".join(lines) + "\n"
