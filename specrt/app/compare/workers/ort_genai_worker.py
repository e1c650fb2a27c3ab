"""Benchmark worker: onnxruntime-genai on a model folder its own builder wrote (config: {"model": DIR,
"speculative": {its speculative options} (optional: n-gram, or draft-model decoding where DIR's genai_config.json
names a draft)}).

Greedy search through og.Generator: the prompt is appended whole (prefill), then one token per
generate_next_token call (speculative rounds commit several tokens, which it hands out one per call)."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
from protocol import serve


def load(config):
    return {"model": og.Model(config["model"]), "speculative": config.get("speculative") or {}}, og.__version__


def generate(state, ids, max_new, stop_ids, clock):
    params = og.GeneratorParams(state["model"])
    params.set_search_options(max_length=len(ids) + max_new, do_sample=False)
    if state["speculative"]:
        params.set_speculative_options(**state["speculative"])
    generator = og.Generator(state["model"], params)
    generator.append_tokens(np.array([ids], dtype=np.int32))
    out = []
    while len(out) < max_new and not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        clock.token()
        if token in stop_ids:
            break
        out.append(token)
    return out


if __name__ == "__main__":
    serve(load, generate)
