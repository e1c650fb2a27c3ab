"""The line protocol every benchmark worker speaks (standalone: workers import nothing from specrt).

A worker is started as `PYTHON WORKER.py CONFIG_JSON` inside its system's own environment. It loads its model,
writes one line `{"ready": true, "version": "..."}` to stdout, then answers each request line
`{"input_ids": [...], "max_new_tokens": N, "stop_ids": [...]}` with
`{"token_ids": [...], "prefill_seconds": s, "decode_seconds": s}`: greedy decoding, the stop token not included,
decode time from the first new token to the last (the definition specrt's own tokens/s uses); a system that
speculates and counts its drafts adds `"draft": [drafted, accepted]` (tokens). Any failure is
answered `{"error": "one line"}`. Log output goes to stderr, which the harness sends to a log file.
"""

from __future__ import annotations

import json
import sys
import time
import traceback


def serve(load, generate) -> None:
    """load(config) -> (state, version); generate(state, ids, max_new, stop_ids, clock) -> token ids."""
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries that print must not corrupt the protocol
    config = json.loads(sys.argv[1])
    try:
        state, version = load(config)
    except Exception as exc:  # noqa: BLE001 - reported to the harness as one line
        traceback.print_exc()
        _send(out, {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        return
    _send(out, {"ready": True, "version": version})
    for line in sys.stdin:
        request = json.loads(line)
        clock = Clock()
        try:
            tokens = generate(state, request["input_ids"], request["max_new_tokens"], set(request["stop_ids"]), clock)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            _send(out, {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
            continue
        reply = {"token_ids": tokens, "prefill_seconds": clock.prefill(), "decode_seconds": clock.decode()}
        if clock.draft is not None:
            reply["draft"] = list(clock.draft)
        _send(out, reply)


class Clock:
    """Marks the start, the first new token and the last new token of one generation."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first = self.last = None
        self.draft = None  # (drafted, accepted) tokens, where the system counts them

    def token(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now

    def prefill(self) -> float:
        return (self.first or self.start) - self.start

    def decode(self) -> float:
        return (self.last - self.first) if self.first is not None else 0.0


def _send(out, obj) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()
