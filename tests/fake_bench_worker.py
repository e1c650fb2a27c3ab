"""A fake benchmarked system's worker, speaking the real worker protocol (app/compare/workers/protocol.py).

config: {"name", "log": FILE, "tokens_per_second": R, "fail_load": bool, "fail_at": N | null}. Its "decode time"
is set, not slept: n tokens take exactly n / R seconds, so medians and speedups can be checked to the digit. Every
request is appended to the log file (name and max_new_tokens), so the order the harness asked in can be read back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "specrt" / "app" / "compare" / "workers"))
from protocol import serve  # noqa: E402


def load(config):
    if config.get("fail_load"):
        raise RuntimeError("this fake system does not load")
    return {"config": config, "calls": 0}, "fake-1.0"


def generate(state, ids, max_new, stop_ids, clock):
    config = state["config"]
    state["calls"] += 1
    if config.get("fail_at") == state["calls"]:
        raise RuntimeError(f"fake failure at call {state['calls']}")
    with open(config["log"], "a") as f:
        f.write(json.dumps({"name": config["name"], "max_new": max_new}) + "\n")
    tokens = [(sum(ids) + 7 * i) % 50 + 3 for i in range(max_new)]
    clock.first = clock.start
    clock.last = clock.start + len(tokens) / config["tokens_per_second"]
    return tokens


if __name__ == "__main__":
    serve(load, generate)
