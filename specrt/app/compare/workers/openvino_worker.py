"""Benchmark worker: OpenVINO GenAI's LLMPipeline on IR folders exported by optimum-intel from the same weights.

config: {"model": IR_DIR, "mode": "none" | "prompt-lookup" | "draft-model" | "eagle3", "draft": IR_DIR (draft
model or EAGLE-3 head), "properties": {OpenVINO CPU properties}, "assistant_tokens": K, "max_ngram": N}.
Greedy; the speculative modes draft K tokens per step (OpenVINO GenAI's documented default 5), prompt lookup
matches n-grams up to max_ngram (its documented 3). A streamer marks each step's tokens for the clock."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino_genai as og
from protocol import serve


def load(config):
    props = dict(config.get("properties") or {})
    mode = config.get("mode", "none")
    kwargs = {}
    if mode == "prompt-lookup":
        kwargs["prompt_lookup"] = True
    elif mode in ("draft-model", "eagle3"):
        kwargs["draft_model"] = og.draft_model(config["draft"], "CPU", **props)
    pipe = og.LLMPipeline(config["model"], "CPU", **kwargs, **props)
    core = ov.Core()  # the precisions it computes in: the ones asked for, else the CPU plugin's defaults
    hint = props.get("INFERENCE_PRECISION_HINT") or str(core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
    kv = props.get("KV_CACHE_PRECISION") or str(core.get_property("CPU", "KV_CACHE_PRECISION"))
    version = f"{og.__version__} ({hint} compute, {kv} KV cache)"
    return {"pipe": pipe, "mode": mode, "k": int(config.get("assistant_tokens", 5)),
            "ngram": int(config.get("max_ngram", 3))}, version


class _Streamer(og.StreamerBase):
    """Marks the clock each time the pipeline hands over new tokens (one or more per step)."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def write(self, token):
        self.clock.token()
        return og.StreamingStatus.RUNNING

    def end(self):
        pass


def generate(state, ids, max_new, stop_ids, clock):
    config = og.GenerationConfig()
    config.max_new_tokens = max_new
    config.do_sample = False
    config.stop_token_ids = set(stop_ids)
    if state["mode"] != "none":
        config.num_assistant_tokens = state["k"]
    if state["mode"] == "prompt-lookup":
        config.max_ngram_size = state["ngram"]
    prompt = ov.Tensor(np.array([ids], dtype=np.int64))
    result = state["pipe"].generate(prompt, config, _Streamer(clock))
    out = []
    for token in result.tokens[0]:
        if int(token) in stop_ids:
            break
        out.append(int(token))
    return out[:max_new]


if __name__ == "__main__":
    serve(load, generate)
