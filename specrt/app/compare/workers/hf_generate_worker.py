"""Benchmark worker: Hugging Face `generate` on transformers (torch, fp32) or optimum's ONNX Runtime model.

config: {"model": HF_DIR, "backend": "transformers" | "optimum", "threads": N,
         "prompt_lookup": K (0: off), "assistant": HF_DIR | null, "export_dir": DIR (optimum)}
Greedy, with a streamer that stamps each new token. Optimum exports the folder to ONNX once (into export_dir,
written under a temporary name and renamed when complete) and loads that export afterwards."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from protocol import serve


def _optimum_model(config):
    from optimum.onnxruntime import ORTModelForCausalLM

    export = Path(config["export_dir"])
    if not (export / "config.json").is_file():
        partial = export.with_name(export.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        ORTModelForCausalLM.from_pretrained(config["model"], export=True).save_pretrained(partial)
        os.replace(partial, export)
    import optimum.version

    return ORTModelForCausalLM.from_pretrained(export), f"optimum-onnx (optimum {optimum.version.__version__})"


def load(config):
    import transformers

    torch.set_num_threads(config["threads"])
    if config["backend"] == "optimum":
        model, version = _optimum_model(config)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(config["model"], dtype=torch.float32).eval()
        version = transformers.__version__
    assistant = None
    if config.get("assistant"):
        assistant = transformers.AutoModelForCausalLM.from_pretrained(config["assistant"], dtype=torch.float32).eval()
    return (model, assistant, config.get("prompt_lookup", 0)), version


class _Stamp:
    """A streamer: the first put() holds the prompt, every later one new tokens."""

    def __init__(self, clock):
        self.clock, self.prompt_seen = clock, False

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.clock.token()

    def end(self):
        pass


def generate(state, ids, max_new, stop_ids, clock):
    model, assistant, lookup = state
    extra = {}
    if lookup:
        extra["prompt_lookup_num_tokens"] = lookup
    if assistant is not None:
        extra["assistant_model"] = assistant
    input_ids = torch.tensor([ids], dtype=torch.long)
    stops = sorted(stop_ids)
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new,
                             do_sample=False, eos_token_id=stops, pad_token_id=stops[0] if stops else 0,
                             streamer=_Stamp(clock), **extra)
    new = [int(t) for t in out[0, len(ids):]]
    for i, t in enumerate(new):
        if t in stop_ids:
            return new[:i]
    return new


if __name__ == "__main__":
    serve(load, generate)
