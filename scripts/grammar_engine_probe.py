"""Probe: CPU cost of a grammar engine's next-token mask, per token, on a real JSON path
(docs/research-grammar-engines.md). Engines: llguidance 1.9.1, xgrammar 0.2.8, outlines-core 0.2.14 (the last two
are not specrt dependencies: install them to run this). Tokenizers: a bundle's tokenizer.json.
    python scripts/grammar_engine_probe.py TOKENIZER_JSON"""
import argparse
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("tokenizer", metavar="TOKENIZER_JSON")
args = ap.parse_args()
import json, time
import numpy as np
from transformers import PreTrainedTokenizerFast

tok = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer)
V = len(tok)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False},
    "score": {"type": "number"}, "active": {"type": "boolean"}},
    "required": ["name", "age", "tags", "address", "score", "active"], "additionalProperties": False}
TEXT = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["red", "blue"], "address": {"city": "London", "zip": "12345"},
                   "score": 0.75, "active": True}, separators=(",", ":"))
ids = tok.encode(TEXT, add_special_tokens=False)
print(f"vocab {V}, {len(ids)} tokens on the path")

def report(name, compile_s, per_token, ok):
    per = np.array(per_token) * 1e3
    print(f"{name:12s} compile {compile_s*1e3:8.1f} ms  mask per token: median {np.median(per):.3f} ms  p90 {np.percentile(per, 90):.3f} ms  max {per.max():.3f} ms  path accepted {ok}")

# llguidance
import llguidance, llguidance.hf, llguidance.numpy
t = time.perf_counter()
lt = llguidance.hf.from_tokenizer(tok)
grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
m = llguidance.LLMatcher(lt, grammar)
c = time.perf_counter() - t
mask = llguidance.numpy.allocate_token_bitmask(1, lt.vocab_size)
times, ok = [], True
for i in ids:
    t = time.perf_counter(); llguidance.numpy.fill_next_token_bitmask(m, mask, 0); times.append(time.perf_counter() - t)
    allowed = (mask[0, i // 32] >> (i % 32)) & 1
    ok &= bool(allowed)
    m.consume_token(i)
report("llguidance", c, times, ok)

# xgrammar
import xgrammar as xgr
t = time.perf_counter()
info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V)
comp = xgr.GrammarCompiler(info)
cg = comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
gm = xgr.GrammarMatcher(cg)
c = time.perf_counter() - t
bm = xgr.allocate_token_bitmask(1, V)
times, ok = [], True
for i in ids:
    t = time.perf_counter(); gm.fill_next_token_bitmask(bm); times.append(time.perf_counter() - t)
    ok &= bool((int(bm[0, i // 32]) >> (i % 32)) & 1)
    gm.accept_token(i)
report("xgrammar", c, times, ok)

# outlines-core
from outlines_core import Guide, Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema
t = time.perf_counter()
regex = build_regex_from_schema(json.dumps(SCHEMA))
eos = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else V - 1
vmap = {}
for s, i in tok.get_vocab().items():
    if i == eos: continue
    vmap.setdefault(s, []).append(i)
try:
    vocab = Vocabulary(eos, vmap)
    index = Index(regex, vocab)
    c = time.perf_counter() - t
    g = Guide(index)
    times, ok = [], True
    for i in ids:
        t = time.perf_counter(); allowed = g.get_tokens(); times.append(time.perf_counter() - t)
        ok &= i in set(allowed)
        g.advance(i)
    report("outlines", c, times, ok)
except Exception as e:
    print("outlines-core failed:", type(e).__name__, str(e)[:200])
