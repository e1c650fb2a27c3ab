"""Constrained generation, measured: JSON extraction from held-out texts, 128 tokens at most, greedy.

    python scripts/bench_constrained.py BUNDLE [--gguf MODEL.gguf] [--rounds 2]

Rows (one run, every row on every text, rounds in alternating order): plain constrained decoding (one target call a
token), the grammar drafting (its forced tokens verified with the rest), the grammar + n-gram, the grammar + the
bundle's EAGLE-3 head; tok/s (decode, each row's own clock), target calls per output token and the share of tokens
the grammar forced; whether each row's output equals plain's. With --gguf, llama.cpp (llama-cpp-python) on the same
GGUF and prompts with its json_schema grammar, as its server constrains output (no regex patterns in the schemas:
llama-cpp-python 0.3.36's schema converter writes `\\d` as a literal and its worker crashed on one).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

S = {"type": "string", "maxLength": 40}
TASKS = [
    ("Maria Lopez, 34, is a nurse in Seville. She speaks Spanish and English and has two cats.",
     {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                       "job": S, "city": S, "languages": {"type": "array", "items": S, "maxItems": 4},
                                       "pets": {"type": "integer", "minimum": 0, "maximum": 20}},
      "required": ["name", "age", "job", "city", "languages"], "additionalProperties": False}),
    ("The Acme X200 vacuum costs 249 dollars, weighs 3.2 kg, comes in red or grey and is in stock.",
     {"type": "object", "properties": {"product": S, "price_usd": {"type": "number", "minimum": 0},
                                       "weight_kg": {"type": "number", "minimum": 0},
                                       "colors": {"type": "array", "items": S, "maxItems": 4},
                                       "in_stock": {"type": "boolean"}},
      "required": ["product", "price_usd", "colors", "in_stock"], "additionalProperties": False}),
    ("The board meets on 12 March 2027 at 10:00 in Room 4B to discuss the budget and hiring; Tom and Ana attend.",
     {"type": "object", "properties": {"event": S, "date": S,
                                       "time": S, "room": S,
                                       "topics": {"type": "array", "items": S, "maxItems": 4},
                                       "attendees": {"type": "array", "items": S, "maxItems": 6}},
      "required": ["event", "date", "time", "topics", "attendees"], "additionalProperties": False}),
    ("Flight LH 402 leaves Frankfurt at 13:40 and lands in New York at 16:05; seat 23C, economy.",
     {"type": "object", "properties": {"flight": S, "from": S, "to": S,
                                       "departure": S, "arrival": S, "seat": S,
                                       "cabin": {"enum": ["economy", "premium", "business", "first"]}},
      "required": ["flight", "from", "to", "departure", "arrival", "cabin"], "additionalProperties": False}),
    ("I loved the pasta but the service was slow; 4 out of 5, would come back for the dessert.",
     {"type": "object", "properties": {"sentiment": {"enum": ["positive", "mixed", "negative"]},
                                       "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                                       "liked": {"type": "array", "items": S, "maxItems": 3},
                                       "disliked": {"type": "array", "items": S, "maxItems": 3},
                                       "return": {"type": "boolean"}},
      "required": ["sentiment", "rating", "liked", "disliked", "return"], "additionalProperties": False}),
    ("Order 5531: two notebooks at 3.50 each and one pen at 1.20, shipped to 8 Elm Street, Leeds.",
     {"type": "object", "properties": {"order_id": {"type": "integer"}, "items": {"type": "array", "maxItems": 4,
                                                                                  "items": {"type": "object",
                                                                                            "properties": {
                                                                                                "name": S,
                                                                                                "quantity": {
                                                                                                    "type": "integer",
                                                                                                    "minimum": 1},
                                                                                                "unit_price": {
                                                                                                    "type": "number"}},
                                                                                            "required": [
                                                                                                "name", "quantity",
                                                                                                "unit_price"],
                                                                                            "additionalProperties":
                                                                                                False}},
                                       "address": S},
      "required": ["order_id", "items", "address"], "additionalProperties": False}),
]


def prompt_of(text: str, schema: dict) -> str:
    return f"Extract the facts of this text as JSON with the keys {', '.join(schema['properties'])}.\n\n{text}"


def main() -> None:
    import specrt
    from specrt.app.api import make_drafter
    from specrt.runtime.sampling import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    engine = specrt.load(args.bundle, device="cpu")
    params = SamplingParams(max_new_tokens=args.tokens)
    drafters = {"ngram": make_drafter("ngram", engine.bundle_dir, engine.manifest, engine.providers)}
    if any(d.kind == "eagle3" for d in engine.manifest.drafters):
        drafters["eagle3"] = make_drafter("eagle3", engine.bundle_dir, engine.manifest, engine.providers)
    rows = [("plain constrained", None, False), ("grammar drafting", None, True)]
    rows += [(f"grammar + {k}", d, True) for k, d in drafters.items()]
    formats = [{"type": "json_schema", "json_schema": {"name": "facts", "schema": s}} for _, s in TASKS]
    prompts = [prompt_of(t, s) for t, s in TASKS]
    ids = [engine.prompt_ids(p) for p in prompts]
    results = {name: [] for name, _, _ in rows}
    for r in range(args.rounds):
        order = rows if r % 2 == 0 else rows[::-1]
        for name, drafter, grammar in order:
            engine.grammar_drafts = grammar
            for p, i, f in zip(prompts, ids, formats):
                engine.reset()
                results[name].append(engine.generate(p, params, drafter=drafter, ids=i, response_format=f).wait())
    engine.grammar_drafts = True
    flags = _cpu_flags()
    print(f"CPU: {platform.processor() or platform.machine()}, {flags}; {len(TASKS)} texts x {args.rounds} rounds, "
          f"max {args.tokens} tokens, greedy, default mode")
    plain = results["plain constrained"]
    base = _rate(plain)
    print("| configuration | tok/s | x plain | target calls / token | forced tokens | same tokens as plain |")
    print("|---|---|---|---|---|---|")
    for name, outs in results.items():
        tokens = sum(o.stats.new_tokens for o in outs)
        calls = sum(o.stats.target_calls for o in outs)
        forced = sum(o.stats.forced_accepted for o in outs)
        same = sum(o.token_ids == p.token_ids for o, p in zip(outs, plain))
        rate = _rate(outs)
        print(f"| {name} | {rate:.1f} | {rate / base:.2f} | {calls / tokens:.2f} | {forced / tokens:.0%} | "
              f"{same} of {len(outs)} |")
    valid = sum(_fits(o.text, s) for o, (_, s) in zip(results["grammar drafting"], TASKS * args.rounds))
    print(f"outputs the schema validates (grammar drafting): {valid} of {len(TASKS) * args.rounds}")
    if args.gguf:
        _llama_cpp(args, ids, engine, base)


def _rate(outs) -> float:
    """Decode tok/s over the row: all its tokens over all its decode seconds."""
    tokens = sum(o.stats.new_tokens for o in outs)
    seconds = sum(o.stats.new_tokens / o.stats.tokens_per_second for o in outs if o.stats.tokens_per_second)
    return tokens / seconds


def _fits(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _llama_cpp(args, ids, engine, base) -> None:
    import specrt
    from specrt.app.compare.systems import llama_cpp_python
    from specrt.app.compare.worker_client import WorkerProcess

    python = llama_cpp_python(log=lambda m: print(m, file=sys.stderr))
    script = Path(specrt.__file__).resolve().parent / "app" / "compare" / "workers" / "llama_cpp_worker.py"
    outs = []
    for i, (_, schema) in zip(ids, TASKS):
        worker = WorkerProcess(python, script, {"model": str(Path(args.gguf).resolve()), "threads": 2,
                                                "n_ctx": 2048, "json_schema": schema},
                               Path("/tmp/specrt-llamacpp-grammar.log"))
        try:
            for _ in range(args.rounds):
                outs.append((worker.generate(i, args.tokens, engine.stop_ids), schema))
        finally:
            worker.close()
    tokens = sum(len(o.token_ids) for o, _ in outs)
    seconds = sum(len(o.token_ids) / o.tokens_per_second for o, _ in outs if o.tokens_per_second)
    valid = sum(_fits(engine.tokenizer.decode(o.token_ids), s) for o, s in outs)
    rate = tokens / seconds
    print(f"| llama.cpp {worker.version}, json_schema grammar | {rate:.1f} | {rate / base:.2f} | 1.00 | - | - |")
    print(f"llama.cpp outputs the schema validates: {valid} of {len(outs)}")


def _cpu_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "flags unknown"
    keep = [f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")]
    return " ".join(keep)


if __name__ == "__main__":
    main()
