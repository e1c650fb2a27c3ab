"""Benchmark worker: onnxruntime-genai on a model folder its own builder wrote (config: {"model": DIR}).

Greedy search through og.Generator: the prompt is appended whole (prefill), then one token per
generate_next_token call."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
from protocol import serve


def load(config):
    return og.Model(config["model"]), og.__version__


def generate(model, ids, max_new, stop_ids, clock):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_new, do_sample=False)
    generator = og.Generator(model, params)
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
