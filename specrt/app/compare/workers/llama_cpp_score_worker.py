"""Scoring worker: llama.cpp (llama-cpp-python) teacher-forced over given tokens, for fidelity measurements
(scripts/gguf_fidelity.py). It speaks the benchmark workers' protocol, answering a request's input_ids with the
argmax of llama.cpp's logits at every position (the token it would choose after each prefix) instead of new tokens.

config: {"model": GGUF, "threads": N, "n_ctx": N}."""

from __future__ import annotations

import llama_cpp
import numpy as np
from protocol import serve


def load(config):
    llm = llama_cpp.Llama(model_path=config["model"], n_ctx=config["n_ctx"], n_threads=config["threads"],
                          n_threads_batch=config["threads"], logits_all=True, verbose=False, seed=0)
    return llm, llama_cpp.__version__


def score(llm, ids, max_new, stop_ids, clock):
    llm.reset()
    llm.eval(list(ids))
    clock.token()
    return [int(t) for t in np.argmax(np.asarray(llm.scores[:len(ids)]), axis=-1)]


if __name__ == "__main__":
    serve(load, score)
