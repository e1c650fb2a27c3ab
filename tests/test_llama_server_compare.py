"""`specrt bench --compare llama-server`: the rows it adds, and its worker against a stand-in server that answers
llama-server's endpoints (/health, /props, /completion with return_tokens and timings) and records the flags it was
started with. The real server (built from llama.cpp's sdist, minutes) runs in the full tier."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from specrt.app.compare import systems
from specrt.app.compare.worker_client import WorkerProcess

FAKE_SERVER = '''#!{python}
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
open({record!r}, "w").write(json.dumps(args))
open({record!r} + ".pid", "w").write(str(os.getpid()))
if "--stubborn" in args:  # a server whose shutdown hangs: SIGTERM does nothing
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
port = int(args[args.index("--port") + 1])
class Handler(BaseHTTPRequestHandler):
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self._send({{"status": "ok"}} if self.path == "/health" else {{"build_info": "b1-stand-in"}})
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert request["cache_prompt"] is False and request["top_k"] == 1 and request["return_tokens"] is True
        tokens = [t + 1 for t in request["prompt"]][: request["n_predict"]]
        timings = {{"prompt_ms": 20.0, "predicted_ms": 50.0}}
        if "--spec-default" in args:  # a speculating server counts its drafts
            timings.update(draft_n=6, draft_n_accepted=4)
        self._send({{"content": "", "tokens": tokens, "timings": timings}})
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def _fake_server(tmp_path: Path) -> tuple[Path, Path]:
    record = tmp_path / "args.json"
    binary = tmp_path / "llama-server"
    binary.write_text(FAKE_SERVER.format(python=sys.executable, record=str(record)))
    binary.chmod(0o755)
    return binary, record


def test_the_worker_sends_token_ids_and_reads_the_servers_timings(tmp_path):
    binary, record = _fake_server(tmp_path)
    config = {"binary": str(binary), "model": "m.gguf", "threads": 2, "n_ctx": 512, "args": ["--spec-default"]}
    worker = WorkerProcess(Path(sys.executable), systems.WORKERS / "llama_server_worker.py", config,
                           tmp_path / "worker.log")
    try:
        assert worker.version == "llama-server b1-stand-in"
        out = worker.generate([5, 6, 7, 8], max_new_tokens=3, stop_ids={8})
        assert out.token_ids == [6, 7]  # the prompt's ids + 1, cut at the stop id 8, n_predict 3
        assert out.prefill_seconds == pytest.approx(0.02)
        assert out.tokens_per_second == pytest.approx(2 / 0.05)  # the server's predicted_ms
        assert out.draft == (6, 4)  # its own count of draft tokens and accepted ones
    finally:
        worker.close()
    args = json.loads(record.read_text())
    assert args[args.index("-m") + 1] == "m.gguf" and args[args.index("-t") + 1] == "2"
    assert args[args.index("-c") + 1] == "512" and "--spec-default" in args and args[args.index("-np") + 1] == "1"


def test_a_server_that_ignores_sigterm_is_killed_when_the_worker_closes(tmp_path):
    """llama-server's graceful shutdown once hung after the worker's SIGTERM: the server outlived the benchmark by an
    hour, slowing every later row. The worker kills a server still running after stop_seconds."""
    binary, record = _fake_server(tmp_path)
    config = {"binary": str(binary), "model": "m.gguf", "threads": 2, "n_ctx": 512, "args": ["--stubborn"],
              "stop_seconds": 0.5}
    worker = WorkerProcess(Path(sys.executable), systems.WORKERS / "llama_server_worker.py", config,
                           tmp_path / "worker.log")
    pid = int(Path(str(record) + ".pid").read_text())
    worker.close()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie awaiting its parent's wait counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_rows_plain_spec_default_and_a_gguf_draft_model(tmp_path, monkeypatch):
    source, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    for f in (source, draft):
        f.write_bytes(b"GGUF")
    monkeypatch.setattr(systems, "gguf_quant_label", lambda path: "Q4_K_M")
    ctx = systems.CompareContext(bundle=tmp_path, source=source, source_kind="gguf", source_sha256=None,
                                 draft_source=draft, draft_kind="gguf", threads=2, n_ctx=1024)
    server = systems.LlamaServer()
    server.binary = tmp_path / "llama-server"
    rows = server.variants("gguf", ["gguf"], ctx, Path(sys.executable))
    assert [(r.drafter, r.precision, r.config["args"]) for r in rows] == [
        ("none", "Q4_K_M", []), ("spec-default", "Q4_K_M", ["--spec-default"]),
        ("draft-simple", "Q4_K_M", ["--spec-type", "draft-simple", "-md", str(draft)])]
    ctx.synth = {"lengths": [1.5, 2.0], "draft_tokens": 3}  # bench --synth-len 1.5 --synth-len 2
    synth = [(r.drafter, r.config["args"]) for r in server.variants("gguf", ["gguf"], ctx, Path(sys.executable))[3:]]
    assert synth == [(f"synth-{n}", ["--spec-type", "draft-simple", "-md", str(draft), "--spec-synth-len", n,
                                     "--spec-draft-n-max", "3"]) for n in ("1.5", "2")]
    ctx.draft_source = None  # no draft model: nothing drafts for its synthetic acceptance
    with pytest.raises(systems.SystemUnavailable, match="--drafter draft-model:DRAFT.gguf"):
        server.variants("gguf", ["gguf"], ctx, Path(sys.executable))
    hf = systems.CompareContext(bundle=tmp_path, source=tmp_path, source_kind="hf", source_sha256=None,
                                draft_source=None, draft_kind=None, threads=2, n_ctx=1024)
    with pytest.raises(systems.SystemUnavailable, match="runs GGUF files"):
        server.variants("int4", ["int4"], hf, Path(sys.executable))


@pytest.mark.full
@pytest.mark.skipif(os.environ.get("SPECRT_FULL") != "1", reason="full tier: builds llama-server (minutes)")
def test_llama_server_decodes_the_default_gguf_as_llama_cpp_does(tmp_path):
    """The real server, built from the sdist, decodes the default model's GGUF greedily: the same first tokens as
    llama-cpp-python gives (both are llama.cpp on the same file, a year of llama.cpp apart: the first 8 tokens)."""
    from specrt.app.compare.llama_server import server_binary
    from specrt.catalog import fetch

    gguf = fetch("smollm2-135m-instruct")
    binary = server_binary(print)
    config = {"binary": str(binary), "model": str(gguf), "threads": 2, "n_ctx": 512, "args": []}
    worker = WorkerProcess(Path(sys.executable), systems.WORKERS / "llama_server_worker.py", config,
                           tmp_path / "server.log")
    prompt = [1, 9690, 2683, 314, 253, 1395]
    try:
        out = worker.generate(prompt, max_new_tokens=16, stop_ids=set())
    finally:
        worker.close()
    reference = WorkerProcess(systems.llama_cpp_python(print), systems.WORKERS / "llama_cpp_worker.py",
                              {"model": str(gguf), "threads": 2, "n_ctx": 512, "prompt_lookup": 0}, tmp_path / "py.log")
    try:
        want = reference.generate(prompt, max_new_tokens=16, stop_ids=set())
    finally:
        reference.close()
    assert len(out.token_ids) == 16 and out.tokens_per_second > 0
    assert out.token_ids[:8] == want.token_ids[:8]
