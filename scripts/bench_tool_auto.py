"""tool_choice auto under a template with a call opener: the lazy call grammar against reading the answer only.

    python scripts/bench_tool_auto.py BUNDLE [--rounds 3] [--tokens 96]

The bundle's model under tests/tool_templates.HERMES (a Qwen2.5-style <tool_call> template), tools get_weather and
add, prose prompts (answers that call nothing), greedy, no drafter. Rows, alternating each round: "read only" (the
answer free, read for calls afterwards: Hermes.auto_grammar replaced by one returning None) and "lazy grammar" (free
text that cannot hold the opener, then only well-formed calls). Prints tok/s (each answer's own decode clock, mean),
tokens and calls per row, and whether the rows' tokens are equal.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ASKS = ["Name three colors of the rainbow and describe each.", "Write a short poem about the sea.",
        "Explain what a CPU cache is."]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    import specrt
    from specrt.runtime import tool_formats
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.tokenizer import BundleTokenizer
    from tests.test_tool_calls import TOOLS
    from tests.tool_templates import TEMPLATES

    engine = specrt.load(a.bundle, device="cpu")
    engine.tokenizer = BundleTokenizer(engine.bundle_dir, TEMPLATES["hermes"])
    params = SamplingParams(max_new_tokens=a.tokens)
    lazy_grammar = tool_formats.Hermes.auto_grammar
    rows: dict[str, list] = {"read only": [], "lazy grammar": []}
    for r in range(a.rounds):
        for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            tool_formats.Hermes.auto_grammar = lazy_grammar if name == "lazy grammar" else (lambda self, *_: None)
            for ask in ASKS:
                out = engine.generate(ask, params, tools=TOOLS, tool_choice="auto", drafter=None).wait()
                rows[name].append((out.stats.tokens_per_second, tuple(out.token_ids), bool(out.tool_calls)))
    tool_formats.Hermes.auto_grammar = lazy_grammar
    print(f"# {platform.processor() or platform.machine()}, {a.rounds} rounds x {len(ASKS)} prompts x {a.tokens} tokens")
    for name, got in rows.items():
        print(f"{name:13s} tok/s {statistics.mean(g[0] for g in got):6.1f}  tokens {sum(len(g[1]) for g in got)}"
              f"  calls {sum(g[2] for g in got)}")
    same = [x[1] == y[1] for x, y in zip(rows["read only"], rows["lazy grammar"])]
    print(f"equal tokens: {sum(same)} of {len(same)}")


if __name__ == "__main__":
    main()
