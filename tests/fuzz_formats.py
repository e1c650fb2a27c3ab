"""Seeded mutation fuzzing of what specrt reads from users' files: run as a subprocess (its memory capped, each
case under an alarm) so that a case that hangs or allocates without end is caught as such, not by the suite.

    python -m tests.fuzz_formats FORMAT SEED_FILE CASES SEED   ->  one JSON line of counts

FORMAT: gguf (the header region of a GGUF file: metadata and tensor infos), safetensors (its JSON header and
the 8-byte length before it), or manifest (SEED_FILE: a bundle folder; one value of its specrt.json replaced,
then the bundle loaded and two tokens generated). Every outcome must be `clean` (a SpecrtError whose message
is one line), `loaded` (the file loads and every tensor reads; the bundle generates), or it is listed under
`other` with its exception.
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

MEMORY_CAP = 8 << 30  # bytes of address space for the whole worker (ONNX Runtime's threads reserve some)
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


HOSTILE_VALUES = [None, -1, 0, 1, 10 ** 9, 2 ** 63, 1.5, float("nan"), "x", "", "../x", "/etc/passwd", [], {}, True,
                  [0, 1], {"a": 1}, [[[[[]]]]]]


def mutate_json(value, rng: random.Random):
    """A copy of a JSON value with one member (at any depth) replaced by a hostile value, or removed."""
    import copy

    value = copy.deepcopy(value)
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + [k])
                walk(v, path + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                paths.append(path + [i])
                walk(v, path + [i])

    walk(value, [])
    path = rng.choice(paths)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(HOSTILE_VALUES)
    return value


def _manifest_cases(bundle: Path, cases: int, rng: random.Random, counts: dict, error_type) -> None:
    import shutil

    import specrt
    from specrt.runtime.sampling import SamplingParams

    original = json.loads((bundle / "specrt.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "bundle"
        shutil.copytree(bundle, work)
        for i in range(cases):
            (work / "specrt.json").write_text(json.dumps(mutate_json(original, rng)))
            _attempt(counts, i, error_type, lambda: specrt.load(str(work), device="cpu", drafter="auto").generate(
                "hello", SamplingParams(max_new_tokens=2)).wait())


def _attempt(counts: dict, i: int, error_type, run) -> None:
    counts["tried"] += 1
    t0 = time.perf_counter()
    signal.alarm(CASE_SECONDS)
    try:
        run()
        counts["loaded"] += 1
    except error_type as exc:
        if "\n" in str(exc):
            counts["other"].append(f"case {i}: an error of several lines: {exc!r:.300}")
        else:
            counts["clean"] += 1
    except BaseException as exc:  # noqa: BLE001: every other outcome is what the fuzzer looks for
        counts["other"].append(f"case {i}: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        signal.alarm(0)
    counts["slowest_s"] = round(max(counts["slowest_s"], time.perf_counter() - t0), 3)


def _load_gguf(path: Path) -> None:
    from specrt.models.gguf_loader import load_gguf

    _, weights, _ = load_gguf(path)
    for name in weights:
        weights[name]


def _load_safetensors(path: Path) -> None:
    from specrt.models.checkpoint_folder import tensor_refs

    for ref in tensor_refs([path], lambda n: n).values():
        ref.read()


def _gguf_region(path: Path) -> int:
    """Where a GGUF file's tensor data starts (its header region ends): after the last tensor info, aligned."""
    import gguf

    return int(gguf.GGUFReader(str(path)).data_offset)


def main(fmt: str, seed_file: str, cases: int, seed: int) -> dict:
    from specrt.errors import SourceError, SpecrtError

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(seed)
    counts = {"format": fmt, "tried": 0, "clean": 0, "loaded": 0, "other": [], "slowest_s": 0.0}
    if fmt == "manifest":
        _manifest_cases(Path(seed_file), cases, rng, counts, SpecrtError)
        return counts
    data = Path(seed_file).read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("case.gguf" if fmt == "gguf" else "case.safetensors")
        if fmt == "gguf":
            region, load = _gguf_region(Path(seed_file)), _load_gguf
        else:
            region, load = 8 + struct.unpack_from("<Q", data)[0], _load_safetensors
        for i in range(cases):
            case = mutate(data, region, rng)
            path.write_bytes(case)
            _attempt(counts, i, SourceError, lambda: load(path))
    return counts


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
