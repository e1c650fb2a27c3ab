"""Soak `specrt serve`: many requests from several clients, some leaving mid-stream or mid-wait, a share hostile
(large bodies near the limit, many messages, bad JSON; and what issue 48 found: an unterminated string of escaped
quotes, a web page's cross-origin text/plain POST, a foreign Host, 1,350 tools, ignore_eos with a grammar, a client
trickling its request head in), the server's memory (RSS) after warm-up and at the end, request latency
percentiles, and whether every well-formed answer is right: the server runs in batch-invariant mode, so each
temperature-0 answer must equal the first answer to the same prompt. For people to read (docs/performance.md,
"Server (throughput, soak)"; docs/server.md), not a test.

    python scripts/serve_soak.py [--requests 2000] [--clients 6] [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 20, "parameters": {
    "type": "object", "properties": {f"field_{j}": {"type": "string", "description": "a value " * 40}
                                     for j in range(12)}}}} for i in range(1350)]
READ_TIMEOUT = 5.0  # the soak server's --read-timeout


def hostile_issue48(base: str, rng: random.Random, body: dict) -> str:
    """One of the requests issue 48 found the server open to; returns the outcome's name."""
    url = f"{base}/v1/chat/completions"
    which = rng.randrange(6)
    if which == 0:  # an unterminated string of escaped quotes (once quadratic backtracking on the event loop)
        r = httpx.post(url, content=b'{"messages": "' + b'\\"' * 500_000, timeout=60,
                       headers={"Content-Type": "application/json"})
        return f"escaped-quotes {r.status_code}"
    if which == 1:  # a web page's simple cross-origin POST
        r = httpx.post(url, content=json.dumps(body), timeout=60,
                       headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
        return f"cross-origin {r.status_code}"
    if which == 2:  # DNS rebinding: a foreign host name
        return f"foreign-host {httpx.post(url, json=body, headers={'Host': 'evil.example'}, timeout=60).status_code}"
    if which == 3:
        r = httpx.post(url, content=json.dumps({**body, "tools": TOOLS}), timeout=300,
                       headers={"Content-Type": "application/json"})
        return f"1350-tools {r.status_code}"
    if which == 4:
        r = httpx.post(url, json={**body, "ignore_eos": True, "response_format": {"type": "json_object"}}, timeout=60)
        return f"ignore_eos+grammar {r.status_code}"
    port = int(base.rsplit(":", 1)[1])  # a request head trickled in: the server must drop it
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(READ_TIMEOUT + 5)
        t0 = time.time()
        try:
            while sock.recv(4096):
                pass
            return f"slow-head dropped {'in time' if time.time() - t0 < READ_TIMEOUT + 2 else 'late'}"
        except socket.timeout:
            return "slow-head NOT dropped"


def one_request(base: str, rng: random.Random, latencies: list, outcomes: dict, lock, answers: dict) -> None:
    kind = rng.random()
    prompt = f"Tell me about the number {rng.randint(1, 40)}."
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0}
    t0 = time.perf_counter()
    try:
        if kind < 0.15:  # leaves mid-stream
            with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True, "max_tokens": 200},
                              timeout=60) as r:
                for _, _ in zip(range(3), r.iter_lines()):
                    pass
            result = "left mid-stream"
        elif kind < 0.20:  # gives up waiting
            try:
                httpx.post(f"{base}/v1/chat/completions", json={**body, "max_tokens": 400}, timeout=0.5)
                result = "finished"
            except httpx.TimeoutException:
                result = "left waiting"
        elif kind < 0.30:
            result = hostile_issue48(base, rng, body)
        elif kind < 0.35:  # hostile: a large body near the limit, many short messages, bad JSON
            which = rng.randrange(3)
            if which == 0:
                payload = json.dumps({**body, "messages": [{"role": "user", "content": "x" * (7 << 20)}]}).encode()
            elif which == 1:
                payload = json.dumps({**body, "messages": [{"role": "user", "content": "a"}] * 4000}).encode()
            else:
                payload = b"{" * 100 + b"oops"
            r = httpx.post(f"{base}/v1/chat/completions", content=payload, timeout=60,
                           headers={"Content-Type": "application/json"})
            result = f"hostile {r.status_code}"
        else:
            r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
            result = f"plain {r.status_code}"
            if r.status_code == 200:  # batch-invariant: the same prompt, the same answer, whatever else ran
                text = r.json()["choices"][0]["message"]["content"]
                with lock:
                    first = answers.setdefault(prompt, text)
                result += " right" if text == first else " WRONG"
            with lock:
                latencies.append(time.perf_counter() - t0)
    except httpx.HTTPError as exc:
        result = f"client error {type(exc).__name__}"
    with lock:
        outcomes[result] = outcomes.get(result, 0) + 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-c", "from specrt.cli import run; run()", "serve", args.model,
                               "--model-id", "m", "--port", str(port), "--queue-size", "32", "--batch-invariant",
                               "--read-timeout", str(READ_TIMEOUT)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        rng, lock = random.Random(0), threading.Lock()
        latencies, outcomes, samples, answers = [], {}, [], {}
        warm = 100
        for i in range(warm):
            one_request(base, rng, [], {}, lock, answers)
        after_warmup = rss_mb(server.pid)
        t0 = time.time()
        todo = list(range(args.requests))

        def client(seed: int):
            r = random.Random(seed)
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                one_request(base, r, latencies, outcomes, lock, answers)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            samples.append(round(rss_mb(server.pid), 1))
            time.sleep(5)
        end = rss_mb(server.pid)
        lat = sorted(latencies)
        print(json.dumps({
            "requests": args.requests, "clients": args.clients, "seconds": round(time.time() - t0, 1),
            "rss_mb_after_warmup": round(after_warmup, 1), "rss_mb_end": round(end, 1),
            "rss_mb_max": max(samples + [end]), "rss_samples_every_5s": samples,
            "plain_latency_p50_s": round(statistics.median(lat), 3) if lat else None,
            "plain_latency_p99_s": round(lat[int(0.99 * (len(lat) - 1))], 3) if lat else None,
            "outcomes": outcomes, "server_alive": server.poll() is None}, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
