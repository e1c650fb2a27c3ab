"""Runs in vLLM's own environment (never imported by specrt): vLLM offline on given prompt token ids, greedy, with a
drafter at a fixed draft length or without one, and the acceptance counters vLLM keeps (vllm.v1.metrics).

    python vllm_spec_worker.py JOB.json OUT.json

JOB: {"target": HF_DIR, "method": "eagle3" | "dflash" | "speculators" | null, "drafter": DIR | null, "k": K,
      "prompts": [[token ids], ...], "max_tokens": N}
("speculators": the drafter folder alone is the model; vLLM loads the verifier its config names, and the method
and draft length from it.)
OUT: {"outputs": [[token ids], ...], "drafts": n, "draft_tokens": n, "accepted": n, "accepted_per_pos": [...],
      "vllm": version, "seconds_start": s, "seconds_generate": s}
"""

import json
import sys
import time


def main(job_path: str, out_path: str) -> None:
    t0 = time.time()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(open(job_path).read())
    spec, model = None, job["target"]
    if job.get("method") == "speculators":
        model = job["drafter"]
    elif job.get("method"):
        spec = {"method": job["method"], "model": job["drafter"], "num_speculative_tokens": job["k"]}
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
              disable_log_stats=False, speculative_config=spec)
    t1 = time.time()
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=job["max_tokens"]), use_tqdm=False)
    t2 = time.time()
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outs], "vllm": vllm.__version__,
              "seconds_start": round(t1 - t0, 1), "seconds_generate": round(t2 - t1, 1)}
    metrics = {m.name: m for m in llm.get_metrics()}
    if job.get("method"):
        result.update({
            "drafts": int(metrics["vllm:spec_decode_num_drafts"].value),
            "draft_tokens": int(metrics["vllm:spec_decode_num_draft_tokens"].value),
            "accepted": int(metrics["vllm:spec_decode_num_accepted_tokens"].value),
            "accepted_per_pos": [int(v) for v in metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values]})
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
