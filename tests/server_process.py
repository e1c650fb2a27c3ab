"""A `specrt serve` process for tests that drive it over real HTTP: started on a free port, waited for until /health
answers, stopped after."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(bundle, *args: str, key: str | None = None):
    """Yields (base URL, the process) of `specrt serve BUNDLE ARGS` (with --api-key when key is given)."""
    import httpx

    port = free_port()
    keyed = ["--api-key", key] if key else []
    proc = subprocess.Popen([sys.executable, "-c", "from specrt.cli import run; run()", "serve", str(bundle),
                             "--port", str(port), *keyed, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {proc.stdout.read()[-2000:]}")
        try:
            if httpx.get(f"{base}/health", headers=headers, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("server did not come up")
    try:
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def script_answers(engine, monkeypatch, answer: str, chunk: int):
    """Make engine.generate answer `answer` (in pieces of `chunk` characters) with the statistics of a real call:
    the server's path is real, the model's text that of a trained model."""
    import dataclasses

    from specrt.runtime.generation import Generation

    real_generate = engine.generate

    def scripted(prompt, params=None, **kw):
        result = dataclasses.replace(real_generate(prompt, params, **kw).wait(), text=answer)
        gen = Generation(iter(()))

        def chunks():
            yield from (answer[i:i + chunk] for i in range(0, len(answer), chunk))
            gen.result = result

        gen._chunks = chunks()
        return gen

    monkeypatch.setattr(engine, "generate", scripted)
