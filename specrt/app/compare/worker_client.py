"""The harness side of a benchmark worker (app/compare/workers/protocol.py): start, ask, stop."""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from specrt.app.compare.environment import SystemUnavailable


SIGNAL_MEANINGS = {
    signal.SIGILL: "an illegal instruction: the system's build uses CPU instructions this process may not run (a "
                   "native build's AMX or AVX-512 under a VM or container that does not grant them)",
    signal.SIGSEGV: "a segmentation fault inside the system",
    signal.SIGBUS: "a bus error (a memory-mapped model file changed or shrank while in use?)",
    signal.SIGKILL: "SIGKILL (out of memory? the kernel's OOM killer sends it)",
    signal.SIGABRT: "an abort inside the system (a failed assertion)",
}


def signal_meaning(number: int) -> str:
    """'SIGILL (an illegal instruction: ...)' for a signal number."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    meaning = SIGNAL_MEANINGS.get(number)
    return f"{name} ({meaning})" if meaning and not meaning.startswith(name) else (meaning or name)


@dataclass
class WorkerOutput:
    token_ids: list[int]
    tokens_per_second: float  # decode phase, as specrt's own GenerationStats measures it
    prefill_seconds: float
    draft: tuple[int, int] | None = None  # (drafted, accepted) tokens, where the system reports them


class WorkerProcess:
    """One worker process: `python script config` with stderr going to log_path."""

    def __init__(self, python: Path, script: Path, config: dict, log_path: Path):
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([str(python), str(script), json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        ready = self._read()
        self.version = ready.get("version", "?")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            code = self.proc.poll()
            if code is not None and code < 0:  # killed by a signal: say which, and what it usually means
                raise SystemUnavailable(f"worker killed by {signal_meaning(-code)} (log: {self.log_path})")
            tail = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
            raise SystemUnavailable(f"worker exited: {tail[-1].strip() if tail else 'no output'} (log: {self.log_path})")
        reply = json.loads(line)
        if "error" in reply:
            raise SystemUnavailable(f"{reply['error']} (log: {self.log_path})")
        return reply

    def generate(self, input_ids: list[int], max_new_tokens: int, stop_ids) -> WorkerOutput:
        request = {"input_ids": list(input_ids), "max_new_tokens": max_new_tokens, "stop_ids": sorted(stop_ids)}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker is gone: _read says why
        reply = self._read()
        tokens = reply["token_ids"]
        decode = reply["decode_seconds"]
        return WorkerOutput(tokens, len(tokens) / decode if decode > 0 else 0.0, reply["prefill_seconds"],
                            tuple(reply["draft"]) if reply.get("draft") else None)

    def close(self) -> None:
        if self._log.closed:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self._log.close()
