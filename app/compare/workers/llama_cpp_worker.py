"""Benchmark worker: llama.cpp through llama-cpp-python, on the GGUF file itself.

config: {"model": GGUF, "threads": N, "n_ctx": N, "prompt_lookup": K (0: off)}. Greedy (temperature 0, no
repetition penalty); with prompt_lookup > 0, llama-cpp-python's own prompt-lookup drafting proposes K tokens."""

from __future__ import annotations

import llama_cpp
from protocol import serve


def load(config):
    draft = None
    if config.get("prompt_lookup"):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=config["prompt_lookup"])
    llm = llama_cpp.Llama(model_path=config["model"], n_ctx=config["n_ctx"], n_threads=config["threads"],
                          n_threads_batch=config["threads"], draft_model=draft, verbose=False, seed=0)
    return llm, llama_cpp.__version__


def generate(llm, ids, max_new, stop_ids, clock):
    llm.reset()  # every prompt is prefilled whole, as for every other system
    out = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        clock.token()
        if token in stop_ids:
            break
        out.append(int(token))
        if len(out) >= max_new:
            break
    return out


if __name__ == "__main__":
    serve(load, generate)
