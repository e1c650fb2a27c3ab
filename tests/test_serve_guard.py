"""`specrt serve` against hostile local traffic (issue 48), on a tiny bundle served by a real uvicorn process: a web
page's requests (foreign Host, foreign Origin, text/plain bodies) refused and an allowed --cors-origin answered with
CORS headers; a body that once froze the event loop, and a request with 1,350 tools, handled while /health answers
within a second; clients trickling a request head or body in dropped at --read-timeout; ignore_eos with a grammar
refused up front."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tests import server_process

APP_ORIGIN = "http://app.example"
ASK = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
READ_TIMEOUT = 2.0


def serve(bundle, *extra: str):
    """A `specrt serve` process on the bundle (CPU, no drafter); yields (base URL, process)."""
    yield from server_process.serve(bundle, "--model-id", "m", "--drafter", "none", "--device", "cpu", *extra)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path_factory.mktemp("src") / "tiny")
    bundle = tmp_path_factory.mktemp("b") / "bundle"
    assert main(["convert", str(src), "-o", str(bundle), "--max-context", "96"]) == 0
    for base, proc in serve(bundle, "--cors-origin", APP_ORIGIN, "--read-timeout", str(READ_TIMEOUT)):
        yield base, proc, bundle


def _health_times(base: str, until: threading.Event) -> list[float]:
    """GET /health over and over until `until` is set: each answer's seconds."""
    import httpx

    times = []
    while not until.is_set():
        t0 = time.perf_counter()
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
        times.append(time.perf_counter() - t0)
        time.sleep(0.05)
    return times


def _while_health_answers(base: str, send):
    """send() in a thread while /health is asked: (send's result, the slowest /health answer in seconds)."""
    done, out = threading.Event(), {}

    def run():
        try:
            out["result"] = send()
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    times = _health_times(base, done)
    thread.join()
    return out.get("result"), max(times, default=0.0)


def test_a_foreign_host_and_a_web_pages_simple_request_are_refused(server):
    import httpx

    base = server[0]
    url = f"{base}/v1/chat/completions"
    # DNS rebinding: a page's own host name pointed at 127.0.0.1
    r = httpx.post(url, json=ASK, headers={"Host": "evil.example"})
    assert r.status_code == 421 and r.json()["error"]["code"] == "host_not_allowed"
    # CSRF: a form-like cross-origin POST needs no preflight
    r = httpx.post(url, content=json.dumps(ASK), headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in r.headers
    r = httpx.post(url, content=json.dumps(ASK), headers={"Content-Type": "text/plain"})  # no Origin: still refused
    assert r.status_code == 415
    r = httpx.options(url, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403
    # loopback names and IP literals pass
    for host in ("localhost", "127.0.0.1", f"127.0.0.1:{base.rsplit(':', 1)[1]}"):
        assert httpx.get(f"{base}/health", headers={"Host": host}).status_code == 200


def test_an_allowed_origin_gets_cors_headers(server):
    import httpx

    base = server[0]
    url = f"{base}/v1/chat/completions"
    r = httpx.options(url, headers={"Origin": APP_ORIGIN, "Access-Control-Request-Method": "POST",
                                    "Access-Control-Request-Headers": "content-type, authorization"})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "content-type" in r.headers["access-control-allow-headers"].lower()
    r = httpx.post(url, json=ASK, headers={"Origin": APP_ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP_ORIGIN
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    own = f"http://127.0.0.1:{base.rsplit(':', 1)[1]}"  # a page the server itself would serve
    assert httpx.post(url, json=ASK, headers={"Origin": own}).status_code == 200


def test_a_pathological_body_is_refused_while_health_answers(server):
    """An unterminated string of escaped quotes (8 MB less a little): once minutes of backtracking on the event
    loop, now a 400 while /health keeps answering."""
    import httpx

    base = server[0]
    body = b'{"messages": "' + b'\\"' * ((8 << 20) // 2 - 64)
    result, slowest = _while_health_answers(base, lambda: httpx.post(
        f"{base}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}, timeout=120))
    assert result.status_code == 400 and result.json()["error"]["code"] == "invalid_json"
    assert slowest < 1.0, slowest


def test_a_request_with_1350_tools_leaves_health_answering(server):
    """1,350 tools (about 7 MB of schemas), checked and rendered into the prompt off the event loop."""
    import httpx

    base = server[0]
    props = {f"field_{j}": {"type": "string", "description": "a value " * 40} for j in range(12)}
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 20,
                                               "parameters": {"type": "object", "properties": props}}}
             for i in range(1350)]
    body = json.dumps({**ASK, "tools": tools}).encode()
    assert 5 << 20 < len(body) < 8 << 20
    result, slowest = _while_health_answers(base, lambda: httpx.post(
        f"{base}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}, timeout=300))
    assert result.status_code in (200, 400), result.text[:300]  # 400: the tiny model's context cannot hold them
    assert slowest < 1.0, slowest


def _dropped_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection (or answers and closes) within `seconds`."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_clients_trickling_a_request_in_are_dropped_at_the_read_timeout(server):
    base = server[0]
    port = int(base.rsplit(":", 1)[1])
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    # the head, a byte every 0.3 s
    slow_head = socket.create_connection(("127.0.0.1", port))
    t0 = time.perf_counter()
    closed = False
    for byte in head:
        try:
            slow_head.send(bytes([byte]))
        except OSError:
            closed = True
            break
        time.sleep(0.3)
        if time.perf_counter() - t0 > READ_TIMEOUT + 3:
            break
    closed = closed or _dropped_within(slow_head, 3)
    assert closed and time.perf_counter() - t0 < READ_TIMEOUT + 5
    # the body, after a whole head, a byte every 0.3 s: 408
    slow_body = socket.create_connection(("127.0.0.1", port))
    slow_body.sendall(head + b"Content-Length: 200\r\n\r\n{")
    t0 = time.perf_counter()
    answer = b""
    slow_body.settimeout(0.3)
    while time.perf_counter() - t0 < READ_TIMEOUT + 5 and b"\r\n\r\n" not in answer:
        try:
            slow_body.send(b" ")
            answer += slow_body.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            break
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.perf_counter() - t0 < READ_TIMEOUT + 3


def test_ignore_eos_with_a_grammar_is_refused_up_front():
    from specrt.app.serve.requests import RequestError, parse

    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    for extra in ({"response_format": schema}, {"response_format": {"type": "json_object"}},
                  {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                   "tool_choice": "required"}):
        with pytest.raises(RequestError, match="ignore_eos") as info:
            parse({**ASK, "ignore_eos": True, **extra}, True, "m", 4096)
        assert info.value.status == 400
    assert parse({**ASK, "ignore_eos": True}, True, "m", 4096).params.stop_token_ids == ()


def test_the_api_key_and_the_host_checks():
    from specrt.app.serve.guard import authorized, host_name, is_loopback

    assert authorized(None, None) and authorized("Bearer k1", "k1")
    assert not authorized("Bearer k2", "k1") and not authorized(None, "k1") and not authorized("Bearer k1é", "k1")
    assert [host_name(h) for h in ("[::1]:8000", "Localhost:80", "a.b", "::1")] == ["::1", "localhost", "a.b", "::1"]
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("[::1]") and is_loopback("localhost.localdomain")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


HOSTILE_TEMPLATES = {  # a bundle's chat template is its maker's code: each once hung the server or bloated it
    "loops that print nothing": '{% for a in "x" * 4000000 %}{% for b in "y" * 4000000 %}{% endfor %}{% endfor %}',
    "center": '{{ "x" | center(400000000) }}',
    "format width": '{{ "%400000000d" | format(1) }}',
    "~ doubling": '{% set ns = namespace(s="ab") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}'
                  '{{ ns.s }}',
}


def _memory_mb(pid: int) -> dict:
    """VmRSS (now) and VmHWM (the peak) of a process, in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_a_hostile_chat_template_is_a_400_within_its_limit(server, tmp_path, name):
    """A copy of the bundle whose manifest carries a hostile template (conversion refuses to write one: tests/
    test_template_limits.py): the request is refused in one line naming the limit, within the render's time limit,
    /health answers within a second meanwhile, and the server's peak memory grows by less than 200 MB."""
    import shutil

    import httpx

    from specrt.runtime.template_sandbox import RENDER_SECONDS

    bundle = tmp_path / "bundle"
    shutil.copytree(server[2], bundle)
    manifest = json.loads((bundle / "specrt.json").read_text())
    manifest["chat_template"] = HOSTILE_TEMPLATES[name]
    (bundle / "specrt.json").write_text(json.dumps(manifest))
    for base, proc in serve(bundle):
        before = _memory_mb(proc.pid)["VmRSS"]
        t0 = time.perf_counter()
        result, slowest = _while_health_answers(base, lambda: httpx.post(
            f"{base}/v1/chat/completions", json=ASK, timeout=120))
        seconds = time.perf_counter() - t0
        error = result.json()["error"]["message"]
        assert result.status_code == 400 and "chat template" in error and "\n" not in error, result.text[:300]
        assert seconds < RENDER_SECONDS + 2 and slowest < 1.0, (seconds, slowest)
        assert _memory_mb(proc.pid)["VmHWM"] - before < 200, _memory_mb(proc.pid)
        assert httpx.post(f"{base}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}).status_code \
            == 200  # raw completions need no template: the server goes on
