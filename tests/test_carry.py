"""bench/carry.py end to end against a local folder standing in for the GPU machine: each call sends a fresh copy of
the working tree (tracked and untracked-not-ignored files) plus the carried parts, never more than the limit, and
the parts wait outside the tree between calls until the file is whole and its sha256 checked."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("carry", ROOT / "bench" / "carry.py")
carry = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(carry)

LIMIT = 3 << 20  # a small stand-in for the 64 MiB a call may carry


def _repo(path: Path) -> Path:
    """A git repository with 1 MiB of tracked files, a shipped head among them, and an ignored carry folder."""
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "code.py").write_bytes(b"x" * (512 << 10))
    head = path / "specrt" / "drafters" / "eagle3" / "heads" / "m"
    head.mkdir(parents=True)
    (head / "model.safetensors").write_bytes(bytes(range(256)) * 2048)  # 512 KiB
    (path / ".gitignore").write_text("/.carry/\n")
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    return path


def _send(repo: Path, carried: list[str], device: Path) -> int:
    """What one call of the device tool does: a fresh copy of the working tree plus the carried paths; returns the
    bytes sent (held to the limit)."""
    shutil.rmtree(device, ignore_errors=True)
    names = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True).stdout.decode().split("\0")
    sent = 0
    for name in filter(None, names + carried + [".carry/" + carry.MANIFEST]):
        src = repo / name
        if src.is_file():
            (device / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, device / name)
            sent += src.stat().st_size
    assert sent <= LIMIT, f"a call carried {sent} bytes, over the {LIMIT}-byte limit"
    return sent


def test_a_wheel_crosses_in_parts_under_the_limit_and_is_joined_with_its_checksum(tmp_path):
    repo = _repo(tmp_path / "repo")
    wheel = tmp_path / "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_27_x86_64.whl"
    wheel.write_bytes(hashlib.sha256(b"seed").digest() * (300 << 10))  # 9.4 MiB: several calls' worth
    assert carry.main(["pack", str(wheel), "--out", str(repo / ".carry"), "--limit", str(LIMIT),
                       "--repo", str(repo)]) == 0
    manifest = json.loads((repo / ".carry" / carry.MANIFEST).read_text())
    parts = manifest["files"][0]["parts"]
    tree = carry.tree_bytes(repo)
    assert len(parts) >= 5 and all(p["size"] <= LIMIT - tree - carry.MARGIN for p in parts)

    calls = carry.plan(repo / ".carry", LIMIT, tree)
    assert sorted(Path(c).name for call in calls for c in call) == [p["file"] for p in parts]
    store, device = tmp_path / "outside-the-tree", tmp_path / "device"
    for i, call in enumerate(calls):
        _send(repo, [str(Path(c).relative_to(repo)) for c in call], device)
        done = carry.receive(device / ".carry", store)
        assert done[wheel.name] == (i == len(calls) - 1)  # whole only once the last part came
    assert carry.sha256(store / wheel.name) == carry.sha256(wheel)
    assert not list(store.glob("*.part*"))  # the parts are gone once joined
    # idempotent: a later call finds it whole and does nothing more
    _send(repo, [], device)
    assert carry.receive(device / ".carry", store) == {wheel.name: True}


def test_a_corrupt_part_is_refused_and_can_be_sent_again(tmp_path):
    repo = _repo(tmp_path / "repo")
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(bytes(range(251)) * 20000)
    carry.pack([wheel], repo / ".carry", 1 << 20)
    first = repo / ".carry" / "w.whl.part000"
    good = first.read_bytes()
    first.write_bytes(b"!" + good[1:])
    store, device = tmp_path / "store", tmp_path / "device"
    names = [f".carry/{p.name}" for p in sorted((repo / ".carry").glob("*.part*"))]
    for i, name in enumerate(names):  # a part a call
        _send(repo, [name], device)
        if i == 0:
            with pytest.raises(carry.CarryError, match="w.whl.part000"):
                carry.receive(device / ".carry", store)
        else:
            assert carry.receive(device / ".carry", store) == {"w.whl": False}
    assert not (store / "w.whl").exists()
    first.write_bytes(good)
    _send(repo, names[:1], device)
    assert carry.receive(device / ".carry", store) == {"w.whl": True}
    assert carry.sha256(store / "w.whl") == carry.sha256(wheel)


def test_too_little_room_beside_the_tree_names_the_remedy_and_aside_makes_room(tmp_path, capsys):
    repo = _repo(tmp_path / "repo")
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"w" * (2 << 20))
    tight = str(carry.tree_bytes(repo) + carry.MARGIN + (600 << 10))  # 600 KiB a call: under the 1 MiB floor
    assert carry.main(["pack", str(wheel), "--out", str(repo / ".carry"), "--limit", tight,
                       "--repo", str(repo)]) == 2
    assert "aside" in capsys.readouterr().err
    head = repo / "specrt" / "drafters" / "eagle3" / "heads" / "m" / "model.safetensors"
    digest = carry.sha256(head)
    place = tmp_path / "aside"
    assert carry.aside(repo, place) == ["specrt/drafters/eagle3/heads/m/model.safetensors"] and not head.exists()
    assert carry.main(["pack", str(wheel), "--out", str(repo / ".carry"), "--limit", tight,
                       "--repo", str(repo)]) == 0
    assert carry.restore(repo, place) == ["specrt/drafters/eagle3/heads/m/model.safetensors"]
    assert carry.sha256(head) == digest
