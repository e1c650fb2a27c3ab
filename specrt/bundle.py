"""The bundle contract: `specrt.json` (schema, dataclasses, read, write, validate).

A bundle is a folder holding specrt.json, the target graph (target.onnx + target.onnx.data), the
tokenizer (tokenizer.json, tokenizer_config.json), the chat template and the drafters' graphs
(a draft model's draft.onnx + draft.onnx.data, described by its entry in `drafters`).
Both sides share this module: convert writes a manifest, the runtime reads and validates it before
building any session. It imports only the standard library.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from specrt.drafter_entry import DrafterEntry, check_drafter_entries
from specrt.errors import BundleError

SCHEMA_VERSION = 1
MANIFEST = "specrt.json"


@dataclass(frozen=True)
class KVLayout:
    layers: int
    kv_heads: int
    head_dim: int
    max_context: int
    dtype: str  # float32 | float16
    layout: str = "batch,kv_heads,max_context,head_dim"
    shared_buffer: bool = True  # past and present bind to one preallocated buffer


@dataclass(frozen=True)
class TargetGraph:
    file: str
    data_file: str
    precision: str  # fp32 | fp16 | int4
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    past_key: str = "past_key_values.{i}.key"
    past_value: str = "past_key_values.{i}.value"
    present_key: str = "present.{i}.key"
    present_value: str = "present.{i}.value"
    hidden_layers: tuple[int, ...] = ()  # residual stream after these layers, concatenated
    hidden_size: int = 0
    int4_block_size: int = 0  # int4 graphs: weights per quantization block (0: written before it was recorded, 32)


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    model_name: str
    architecture: str  # HF model_type
    model_config: dict  # ModelConfig.to_dict()
    target: TargetGraph
    kv: KVLayout
    vocab_size: int
    bos_token_id: int | None
    stop_token_ids: tuple[int, ...]
    chat_template: str | None
    tokenizer_files: tuple[str, ...]
    execution_providers: tuple[str, ...]
    files: dict[str, FileEntry]
    provenance: dict
    drafters: tuple[DrafterEntry, ...] = ()  # convert may pass the entries as dicts: they are checked and typed
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        if any(not isinstance(d, DrafterEntry) for d in self.drafters):
            object.__setattr__(self, "drafters", check_drafter_entries(
                [d.raw if isinstance(d, DrafterEntry) else d for d in self.drafters]))

    def drafter(self, kind: str) -> DrafterEntry | None:
        """The manifest entry of the bundle's drafter of this kind, if it has one."""
        return next((d for d in self.drafters if d.kind == kind), None)

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d = {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v) for k, v in d.items()}
        d["files"] = {name: dataclasses.asdict(entry) for name, entry in self.files.items()}
        d["drafters"] = [entry.raw for entry in self.drafters]
        return json.dumps(d, indent=2, sort_keys=False)

    @staticmethod
    def from_dict(d: dict) -> "Manifest":
        version = d.get("schema_version")
        if not isinstance(version, int):
            raise BundleError("specrt.json has no schema_version")
        if version > SCHEMA_VERSION:
            raise BundleError(
                f"bundle schema {version} is newer than this specrt understands ({SCHEMA_VERSION}); upgrade specrt"
            )
        try:
            d = dict(d)
            d["target"] = TargetGraph(**{**d["target"], "inputs": tuple(d["target"]["inputs"]),
                                         "outputs": tuple(d["target"]["outputs"]),
                                         "hidden_layers": tuple(d["target"].get("hidden_layers", ()))})
            d["kv"] = KVLayout(**d["kv"])
            d["files"] = {k: FileEntry(**v) for k, v in d["files"].items()}
            for key in ("stop_token_ids", "tokenizer_files", "execution_providers"):
                d[key] = tuple(d.get(key, ()))
            d["drafters"] = check_drafter_entries(d.get("drafters", ()))
            return Manifest(**d)
        except (KeyError, TypeError) as exc:
            raise BundleError(f"specrt.json is malformed ({type(exc).__name__}: {exc})") from None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checkpoint_sha256(folder: Path) -> str:
    """One hash over a checkpoint folder's config.json and safetensors files, a DFlash drafter's confidence head
    (models/dflash_confidence.py) included (a cached bundle compares it with the head shipped now, to notice a
    newer one)."""
    h = hashlib.sha256()
    folder = Path(folder)
    for f in [folder / "config.json", *sorted(folder.glob("*.safetensors")),
              *sorted(folder.glob("specrt_confidence_head/*.safetensors"))]:
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(size=path.stat().st_size, sha256=sha256_file(path))


def read_manifest(bundle: Path) -> Manifest:
    bundle = Path(bundle)
    if not bundle.is_dir():
        raise BundleError(f"{bundle}: no such bundle folder")
    path = bundle / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle}: not a specrt bundle (no {MANIFEST})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: manifest is not a JSON object")
    return Manifest.from_dict(data)


def validate_files(bundle: Path, manifest: Manifest, check_hashes: bool = True) -> None:
    """Every file the manifest lists exists with its size (and sha256); BundleError names the first bad one."""
    bundle = Path(bundle)
    needed = {manifest.target.file, manifest.target.data_file, *manifest.tokenizer_files}
    for drafter in manifest.drafters:
        needed |= drafter.files()
    unlisted = sorted(n for n in needed if n not in manifest.files)
    if unlisted:
        raise BundleError(f"{bundle}: manifest lists no checksum for {unlisted[0]}")
    for name, entry in manifest.files.items():
        path = bundle / name
        if not path.is_file():
            raise BundleError(f"{bundle}: missing file {name}")
        size = path.stat().st_size
        if size != entry.size:
            raise BundleError(f"{bundle}: {name} is {size} bytes, the manifest says {entry.size} (truncated or replaced)")
        if check_hashes and sha256_file(path) != entry.sha256:
            raise BundleError(f"{bundle}: {name} does not match its sha256 in the manifest (corrupt)")


def load_bundle(bundle: Path, check_hashes: bool = True) -> Manifest:
    manifest = read_manifest(bundle)
    validate_files(bundle, manifest, check_hashes)
    return manifest
