"""bench/gpu.sh, the device run that carries no weights, checked end to end on the CPU (DEVICE=cpu: Triton's
interpreter, a test-size twin of the 1B shape): it writes the synthetic model, converts it with its EAGLE-3
head, runs the kernel tests and the kernel timing, and bench/gpu_steps.py's step costs and fixed-length runs,
whose speculative outputs must equal plain output; and bench/gpu_families.py over every family's tiny GPU bundle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_script_runs_end_to_end_on_the_cpu(tmp_path):
    env = dict(os.environ, DEVICE="cpu", SIZES="1b", NEW="1,2,4,16",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = json.loads((tmp_path / "out" / "steps-1b.json").read_text())
    assert sorted(int(k) for k in steps["verify_ms"]) == [1, 2, 4, 16]
    assert all(ms > 0 for ms in steps["verify_ms"].values())
    runs = steps["fixed_length"]
    assert [r["draft_length"] for r in runs] == [0, 1, 2, 4]
    assert all(r["equal"] for r in runs)  # lossless at every fixed draft length
    assert all(r["draft_ms_per_step"] > 0 for r in runs[1:])  # the head really ran
    kernels = json.loads((tmp_path / "out" / "kernels-1b.json").read_text())
    assert len(kernels["rows"]) >= 6 and all(r["median_us"] > 0 for r in kernels["rows"])  # the kernel was timed
    manifest = json.loads((tmp_path / "out" / "models" / "1b-fp32" / "specrt.json").read_text())
    assert manifest["drafters"][0]["kind"] == "eagle3"
    # every family's int4 GPU bundle (built for CUDA, run here on the CPU): nothing predicted off the GPU, every node
    # observed in the running session, speculation verified, tree drafts refused in one line
    families = json.loads((tmp_path / "out" / "families.json").read_text())["rows"]
    assert [r["family"] for r in families] == ["llama", "qwen3_5_text", "qwen3_moe", "gpt_oss", "gemma4_text"]
    for row in families:
        assert row["predicted_off_gpu"] == 0 and sum(row["observed"].values()) > 0
        assert row["mean_accepted"] > 1 and row["tree"] == "refused in one line"
