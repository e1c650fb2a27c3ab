"""Benchmark worker: llama-server (llama.cpp's own server, built by compare/llama_server.py) on the GGUF itself.

config: {"binary": PATH, "model": GGUF, "threads": N, "n_ctx": N, "args": [...] (its speculation flags),
"stop_seconds": S (optional: how long it may take to stop after SIGTERM before it is killed)}.
The server is started on a free loopback port with one slot; each prompt's token ids go to /completion, greedy
(top-k 1, temperature 0), without the prompt cache (every prompt is prefilled whole, as for every other system);
the server's own timings give the prefill and decode seconds (decode: its predicted_ms). Standalone: the standard
library only."""

from __future__ import annotations

import atexit
import ctypes
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from protocol import serve

START_SECONDS = 600
STOP_SECONDS = 5.0  # llama-server stops in well under a second; one whose shutdown hangs is killed after this


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(port: int, path: str, body: dict | None = None, timeout: float = 3600):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _die_with_parent() -> None:
    """In the server's process before it starts: the kernel kills it when this worker dies (Linux). SIGKILL, not
    SIGTERM: a SIGTERM arriving with the worker's own (below) is one signal, and llama-server's graceful shutdown
    after it once hung for an hour with a draft model loaded, holding 2 GB and a share of the CPU that every later
    benchmark row paid for."""
    try:
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(server: subprocess.Popen, seconds: float) -> None:
    """SIGTERM, then SIGKILL if the server has not exited within `seconds`."""
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def load(config):
    port = _free_port()
    cmd = [config["binary"], "-m", config["model"], "--host", "127.0.0.1", "--port", str(port), "-t",
           str(config["threads"]), "-tb", str(config["threads"]), "-c", str(config["n_ctx"]), "-np", "1",
           *config.get("args", [])]
    server = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr, preexec_fn=_die_with_parent)
    atexit.register(_stop, server, float(config.get("stop_seconds", STOP_SECONDS)))
    deadline = time.monotonic() + START_SECONDS
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"llama-server exited with {server.returncode} (its output is in this log)")
        try:
            if _call(port, "/health", timeout=5).get("status") == "ok":
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise RuntimeError("llama-server did not answer /health in time")
        time.sleep(0.5)
    props = _call(port, "/props", timeout=30)
    return (server, port), f"llama-server {props.get('build_info', '')}".strip()


def generate(state, ids, max_new, stop_ids, clock):
    _, port = state
    answer = _call(port, "/completion", {"prompt": list(ids), "n_predict": max_new, "temperature": 0.0, "top_k": 1,
                                         "cache_prompt": False, "return_tokens": True, "stream": False})
    tokens = []
    for token in answer.get("tokens", []):
        if token in stop_ids:
            break
        tokens.append(int(token))
    timings = answer.get("timings", {})
    clock.start = 0.0  # the server's clock: prefill, then decoding
    clock.first = timings.get("prompt_ms", 0.0) / 1e3
    clock.last = clock.first + timings.get("predicted_ms", 0.0) / 1e3
    if "draft_n" in timings:  # its speculation's own count
        clock.draft = (int(timings["draft_n"]), int(timings.get("draft_n_accepted", 0)))
    return tokens


if __name__ == "__main__":
    serve(load, generate)
