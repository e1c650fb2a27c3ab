"""Seeded mutation fuzzing of what specrt reads from users' files: run as a subprocess (its memory capped, each
case under an alarm) so that a case that hangs or allocates without end is caught as such, not by the suite.

    python -m tests.fuzz_formats FORMAT SEED_FILE CASES SEED   ->  one JSON line of counts

FORMAT: gguf (the header region of a GGUF file: metadata and tensor infos) or safetensors (its JSON header and
the 8-byte length before it). Every outcome must be `clean` (a SourceError whose message is one line),
`loaded` (the file loads and every tensor reads), or it is listed under `other` with its exception.
"""

from __future__ import annotations

import json
import random
import resource
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path

MEMORY_CAP = 3 << 30  # bytes of address space for the whole worker
CASE_SECONDS = 20

SPECIAL = [0, 1, 2, 3, 7, 8, 9, 12, 13, 255, 1 << 16, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, (1 << 64) - 1]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {CASE_SECONDS} s")


def mutate(data: bytes, region: int, rng: random.Random) -> bytes:
    """One mutation inside data[:region]: a byte flip, a run of random bytes, or a u32/u64/f32 overwritten with
    a boundary value."""
    buf = bytearray(data)
    at = rng.randrange(region)
    kind = rng.randrange(4)
    if kind == 0:
        buf[at] ^= 1 << rng.randrange(8)
    elif kind == 1:
        for i in range(at, min(region, at + rng.randint(1, 8))):
            buf[i] = rng.randrange(256)
    elif kind == 2:
        fmt = rng.choice(["<I", "<Q"])
        value = rng.choice(SPECIAL) % (1 << (8 * struct.calcsize(fmt)))
        buf[at:at + struct.calcsize(fmt)] = struct.pack(fmt, value)[:len(buf) - at]
    else:
        buf[at:at + 4] = struct.pack("<f", rng.choice([0.0, -1.0, float("inf"), float("nan"), 1e30]))[:len(buf) - at]
    return bytes(buf)


def _load_gguf(path: Path) -> None:
    from specrt.models.gguf_loader import load_gguf

    _, weights, _ = load_gguf(path)
    for name in weights:
        weights[name]


def _load_safetensors(path: Path) -> None:
    from specrt.models.checkpoint_folder import tensor_refs

    for ref in tensor_refs([path], lambda n: n).values():
        ref.read()


def _gguf_region(data: bytes) -> int:
    """Where a GGUF file's tensor data starts (its header region ends): after the last tensor info, aligned."""
    import gguf

    reader = gguf.GGUFReader(BytesPath.write(data))
    return int(reader.data_offset)


class BytesPath:
    path: Path | None = None

    @classmethod
    def write(cls, data: bytes) -> str:
        cls.path.write_bytes(data)
        return str(cls.path)


def main(fmt: str, seed_file: str, cases: int, seed: int) -> dict:
    from specrt.errors import SourceError

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    signal.signal(signal.SIGALRM, _alarm)
    data = Path(seed_file).read_bytes()
    rng = random.Random(seed)
    counts = {"format": fmt, "tried": 0, "clean": 0, "loaded": 0, "other": [], "slowest_s": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("case.gguf" if fmt == "gguf" else "case.safetensors")
        BytesPath.path = path
        if fmt == "gguf":
            region, load = _gguf_region(data), _load_gguf
        else:
            region, load = 8 + struct.unpack_from("<Q", data)[0], _load_safetensors
        for i in range(cases):
            case = mutate(data, region, rng)
            path.write_bytes(case)
            counts["tried"] += 1
            t0 = time.perf_counter()
            signal.alarm(CASE_SECONDS)
            try:
                load(path)
                counts["loaded"] += 1
            except SourceError as exc:
                if "\n" in str(exc):
                    counts["other"].append(f"case {i}: a SourceError of several lines: {exc!r:.300}")
                else:
                    counts["clean"] += 1
            except BaseException as exc:  # noqa: BLE001: every other outcome is what the fuzzer looks for
                counts["other"].append(f"case {i}: {type(exc).__name__}: {str(exc)[:300]}")
            finally:
                signal.alarm(0)
            counts["slowest_s"] = round(max(counts["slowest_s"], time.perf_counter() - t0), 3)
    return counts


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
