"""Soak `specrt serve`: many requests from several clients, some leaving mid-stream or mid-wait, some hostile
(large bodies near the limit, many messages, bad JSON), and the server's memory (RSS) after warm-up and at the
end, with request latency percentiles. For people to read (docs/perf.md), not a test.

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


def one_request(base: str, rng: random.Random, latencies: list, outcomes: dict, lock) -> None:
    kind = rng.random()
    body = {"model": "m", "messages": [{"role": "user", "content": f"Tell me about the number {rng.randint(1, 999)}."}],
            "max_tokens": 16, "temperature": 0}
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
        elif kind < 0.25:  # hostile: a large body near the limit, many short messages, bad JSON
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
                               "--model-id", "m", "--port", str(port), "--queue-size", "32"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        rng, lock = random.Random(0), threading.Lock()
        latencies, outcomes, samples = [], {}, []
        warm = 100
        for i in range(warm):
            one_request(base, rng, [], {}, lock)
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
                one_request(base, r, latencies, outcomes, lock)

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
