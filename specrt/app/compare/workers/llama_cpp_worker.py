"""Benchmark worker: llama.cpp through llama-cpp-python, on the GGUF file itself.

config: {"model": GGUF, "threads": N, "n_ctx": N, "prompt_lookup": K (0: off), "json_schema": SCHEMA (optional)}.
Greedy (temperature 0, no repetition penalty); with prompt_lookup > 0, llama-cpp-python's own prompt-lookup drafting
proposes K tokens; with json_schema, the output is constrained to it by llama.cpp's grammar (GBNF from the schema,
as its server's json_schema does), a fresh grammar state per generation."""

from __future__ import annotations

import json

import llama_cpp
from protocol import serve


def load(config):
    draft = None
    if config.get("prompt_lookup"):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=config["prompt_lookup"])
    llm = llama_cpp.Llama(model_path=config["model"], n_ctx=config["n_ctx"], n_threads=config["threads"],
                          n_threads_batch=config["threads"], draft_model=draft, verbose=False, seed=0)
    schema = config.get("json_schema")
    return (llm, json.dumps(schema) if schema is not None else None), llama_cpp.__version__


def generate(state, ids, max_new, stop_ids, clock):
    llm, schema = state
    llm.reset()  # every prompt is prefilled whole, as for every other system
    grammar = llama_cpp.LlamaGrammar.from_json_schema(schema, verbose=False) if schema is not None else None
    out = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True,
                              grammar=grammar):
        clock.token()
        if token in stop_ids:
            break
        out.append(int(token))
        if len(out) >= max_new:
            break
    return out


if __name__ == "__main__":
    serve(load, generate)
