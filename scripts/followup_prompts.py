"""Prompts files for measuring speculation that learns across requests (an n-gram pool such as `auto`'s ngram:pool
or llama-server's --spec-default): repeated questions and follow-up questions.

    python scripts/followup_prompts.py BUNDLE --limit 4 --max-new-tokens 64 --out DIR

writes DIR/repeated.jsonl: MT-Bench's first LIMIT questions, then the same questions again (a user asking again, a
regenerated answer), and DIR/followup.jsonl: each question, then its MT-Bench second turn as a conversation whose
assistant turn is the bundle's own greedy answer to the first (what a chat client sends next). Feed either to
`specrt bench BUNDLE --prompts FILE`; tokens_per_second_by_prompt then splits first asks from the repeats or
follow-ups.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import specrt
    from specrt.datasets import mt_bench_turns
    from specrt.runtime.sampling import SamplingParams

    turns = mt_bench_turns(a.limit)
    a.out.mkdir(parents=True, exist_ok=True)
    firsts = [{"prompt": first} for first, _ in turns]
    _write(a.out / "repeated.jsonl", firsts + firsts)
    engine = specrt.load(a.bundle, device="cpu", drafter="none")
    followups = []
    for first, second in turns:
        answer = engine.generate(first, SamplingParams(max_new_tokens=a.max_new_tokens)).wait().text
        followups += [{"prompt": first}, {"messages": [{"role": "user", "content": first},
                                                       {"role": "assistant", "content": answer},
                                                       {"role": "user", "content": second}]}]
    _write(a.out / "followup.jsonl", followups)
    print(f"{a.out / 'repeated.jsonl'}: {len(firsts)} questions twice; {a.out / 'followup.jsonl'}: "
          f"{len(turns)} questions, each with its follow-up")


def _write(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".partial")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":
    main()
