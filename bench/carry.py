"""Carry a file too large for one transfer (onnxruntime-gpu's wheel: 255 MB) to the GPU machine, in parts.

specrt's GPU machine receives the working tree with every call, at most LIMIT bytes a call (64 MiB), the tracked
files included, and keeps what a call left outside the tree only while it stays busy (30 s idle at most). So:

    python bench/carry.py pack WHEEL --out .carry        # here: WHEEL in parts that fit beside the tree, a manifest
    python bench/carry.py plan .carry                    # here: which parts each call carries (`carry` paths)
    python bench/carry.py receive .carry --store DIR     # there, each call: check the parts that came, keep them in
                                                         # DIR (outside the tree); once all are in, join and check
    python bench/carry.py aside / restore                # here: move the shipped drafter heads (52 MB of the 56 MB
                                                         # the tree weighs) out of the tree and back (checked)

Every part and the joined file are checked against the sha256 in the manifest (.carry/carry.json, which travels
with every call); a part that came corrupted is refused and can be sent again. `receive` is idempotent: a later
call adds its parts to those already kept. Standard library only (it runs on the GPU machine's own Python).
tests/test_carry.py runs the whole path against a local folder standing in for the GPU machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LIMIT = 64 << 20  # bytes one call may carry, the working tree included
MARGIN = 256 << 10  # kept free for the manifest and files written between packing and sending
MANIFEST = "carry.json"
# the trained drafter heads that ship in the tree (specrt/drafters/*/heads/*/model.safetensors): not needed on the GPU
# machine (bench/gpu.sh makes its own models), and most of what the tree weighs
ASIDE_GLOB = "specrt/drafters/*/heads/*/model.safetensors"


class CarryError(Exception):
    """A one-line reason the carry cannot go on."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_bytes(repo: Path, leave_out: str = "") -> int:
    """What every call carries anyway: the tracked files present and the untracked files git does not ignore
    (those under `leave_out`, the carry folder itself, not counted)."""
    names = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True).stdout.decode().split("\0")
    total = 0
    for name in filter(None, names):
        path = repo / name
        if leave_out and (name == leave_out or name.startswith(leave_out.rstrip("/") + "/")):
            continue
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def pack(files: list[Path], out: Path, part_bytes: int) -> dict:
    """Split each file into parts of at most part_bytes under `out`, with a manifest of every part's sha256."""
    if part_bytes < 1 << 20:
        raise CarryError(f"only {part_bytes >> 10} KiB a call is left beside the working tree: move what need not "
                         "travel out of it first (bench/carry.py aside)")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"part_bytes": part_bytes, "files": []}
    for path in files:
        entry = {"name": path.name, "size": path.stat().st_size, "sha256": sha256(path), "parts": []}
        with open(path, "rb") as f:
            index = 0
            while block := f.read(part_bytes):
                part = out / f"{path.name}.part{index:03d}"
                part.write_bytes(block)
                entry["parts"].append({"file": part.name, "size": len(block),
                                       "sha256": hashlib.sha256(block).hexdigest()})
                index += 1
        manifest["files"].append(entry)
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / MANIFEST)
    return manifest


def plan(folder: Path, limit: int, tree: int) -> list[list[str]]:
    """The calls: each a list of parts (paths relative to the repository) that fit beside the tree and manifest."""
    manifest = json.loads((folder / MANIFEST).read_text())
    if (folder / MANIFEST).stat().st_size > MARGIN // 2:
        raise CarryError(f"{MANIFEST} outgrew the room kept for it: carry fewer files at once")
    room = limit - tree - MARGIN  # the margin holds the manifest
    calls, current, used = [], [], 0
    for entry in manifest["files"]:
        for part in entry["parts"]:
            if part["size"] > room:
                raise CarryError(f"{part['file']} ({part['size']} bytes) does not fit beside the {tree}-byte tree "
                                 f"({limit}-byte limit): pack again with smaller parts")
            if current and (used + part["size"] > room or len(current) == 7):  # a call names 8 paths at most
                calls.append(current)
                current, used = [], 0
            current.append(str(folder / part["file"]))
            used += part["size"]
    if current:
        calls.append(current)
    return calls


def receive(folder: Path, store: Path) -> dict[str, bool]:
    """Keep the parts that came (checked) in `store`; join every file whose parts are all there (checked).
    Returns {file name: complete}. A corrupt part is refused (CarryError) after the good ones are kept."""
    manifest = json.loads((folder / MANIFEST).read_text())
    store.mkdir(parents=True, exist_ok=True)
    refused, done = [], {}
    for entry in manifest["files"]:
        final = store / entry["name"]
        if final.is_file() and final.stat().st_size == entry["size"] and sha256(final) == entry["sha256"]:
            done[entry["name"]] = True
            continue
        for part in entry["parts"]:
            came, kept = folder / part["file"], store / part["file"]
            if kept.is_file() and sha256(kept) == part["sha256"]:
                continue
            if came.is_file():
                if came.stat().st_size != part["size"] or sha256(came) != part["sha256"]:
                    refused.append(part["file"])
                    continue
                shutil.copyfile(came, kept.with_suffix(".tmp"))
                os.replace(kept.with_suffix(".tmp"), kept)
        have = [store / p["file"] for p in entry["parts"]]
        if all(p.is_file() for p in have):
            tmp = final.with_name(final.name + ".joining")
            with open(tmp, "wb") as out:
                for p in have:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
            if sha256(tmp) != entry["sha256"]:
                tmp.unlink()
                raise CarryError(f"{entry['name']}: joined parts do not match its sha256; send them again")
            os.replace(tmp, final)
            for p in have:
                p.unlink()
        done[entry["name"]] = final.is_file()
    if refused:
        raise CarryError(f"refused {len(refused)} corrupt part(s): {', '.join(refused)}; send them again")
    return done


def aside(repo: Path, place: Path) -> list[str]:
    """Move the shipped heads out of the tree to `place` (with their sha256), so that a call carries less."""
    moved = []
    place.mkdir(parents=True, exist_ok=True)
    record = {}
    for path in sorted(repo.glob(ASIDE_GLOB)):
        rel = str(path.relative_to(repo))
        target = place / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        record[rel] = sha256(path)
        shutil.move(str(path), target)
        moved.append(rel)
    old = json.loads((place / "aside.json").read_text()) if (place / "aside.json").is_file() else {}
    (place / "aside.json").write_text(json.dumps({**old, **record}, indent=1))
    return moved


def restore(repo: Path, place: Path) -> list[str]:
    """Put back what `aside` moved, each file checked against its sha256."""
    record = json.loads((place / "aside.json").read_text())
    for rel, digest in record.items():
        kept = place / rel
        if sha256(kept) != digest:
            raise CarryError(f"{rel}: the copy set aside no longer matches its sha256 (git checkout -- {rel})")
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(kept), repo / rel)
    (place / "aside.json").unlink()
    return list(record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="split files into parts that fit beside the working tree")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=Path(".carry"))
    p.add_argument("--limit", type=int, default=LIMIT, help="bytes a call may carry, the tree included")
    p.add_argument("--repo", type=Path, default=Path("."))
    p = sub.add_parser("plan", help="print the parts each call carries, one call a line")
    p.add_argument("folder", type=Path)
    p.add_argument("--limit", type=int, default=LIMIT)
    p.add_argument("--repo", type=Path, default=Path("."))
    p = sub.add_parser("receive", help="on the GPU machine: keep the parts that came, join what is whole")
    p.add_argument("folder", type=Path)
    p.add_argument("--store", type=Path, default=Path(tempfile.gettempdir()) / "specrt-carry")
    for name in ("aside", "restore"):
        p = sub.add_parser(name, help=f"{name} the shipped drafter heads ({ASIDE_GLOB})")
        p.add_argument("--repo", type=Path, default=Path("."))
        p.add_argument("--place", type=Path, default=Path(tempfile.gettempdir()) / "specrt-aside")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            repo = args.repo.resolve()
            out = args.out if args.out.is_absolute() else repo / args.out
            leave = str(out.relative_to(repo)) if out.is_relative_to(repo) else ""
            part = args.limit - tree_bytes(repo, leave) - MARGIN
            manifest = pack(args.files, out, part)
            print(f"{sum(len(f['parts']) for f in manifest['files'])} parts of at most {part} bytes in {out}")
        elif args.command == "plan":
            repo = args.repo.resolve()
            folder = args.folder if args.folder.is_absolute() else repo / args.folder
            leave = str(folder.relative_to(repo)) if folder.is_relative_to(repo) else ""
            for call in plan(folder, args.limit, tree_bytes(repo, leave)):
                print(" ".join(str(Path(c).relative_to(repo)) if Path(c).is_relative_to(repo) else c for c in call))
        elif args.command == "receive":
            done = receive(args.folder, args.store)
            for name, complete in done.items():
                print(f"{name}: {'complete' if complete else 'waiting for parts'} in {args.store}")
        elif args.command == "aside":
            print(f"moved {len(aside(args.repo, args.place))} files to {args.place}")
        else:
            print(f"restored {len(restore(args.repo, args.place))} files")
    except (CarryError, OSError, ValueError, KeyError) as exc:
        print(f"carry: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
