"""The manifest's drafter entries (specrt.json `drafters`), typed: a DrafterEntry per drafter, checked when the
manifest is read (standard library only; shared by convert and runtime).

Every entry carries its kind, its graph (file names) and its KV layout; each kind's further fields are listed in
the registry (specrt/drafter_kinds.py) and their types here. A malformed entry is a one-line BundleError naming the
entry and the field, never a KeyError inside a drafter. An entry of a kind this specrt does not know is kept as
written, unchecked (no drafter here can run it). `raw` keeps the entry as written: convert writes it, and fields
that only inform (validation results, the source's config) are read from it by `specrt info` and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specrt.drafter_kinds import KINDS
from specrt.errors import BundleError


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value) -> bool:
    return isinstance(value, str) and bool(value)


def _indices(value) -> bool:
    return isinstance(value, list) and bool(value) and all(_index(v) for v in value)


def _object(value) -> bool:
    return isinstance(value, dict)


POSITIVE, INDICES = (_positive, "a positive integer"), (_indices, "a list of layer indices")
# field -> (check, what the check wants): every field a kind may list in the registry's entry_fields
FIELDS = {
    "vocab_size": POSITIVE, "draft_vocab_size": POSITIVE, "target_hidden_size": POSITIVE, "block_size": POSITIVE,
    "mask_token_id": (_index, "a token id"), "aux_layers": INDICES, "target_layer_ids": INDICES,
    "model_config": (_object, "an object"),
}
GRAPH = {"file": (_text, "a file name"), "data_file": (_text, "a file name")}
GRAPH_HIDDEN = {"hidden_size": POSITIVE}  # the heads' own width (not a draft model's)
KV = {name: POSITIVE for name in ("layers", "kv_heads", "head_dim", "max_context")}


@dataclass(frozen=True)
class DrafterGraph:
    file: str
    data_file: str
    hidden_size: int = 0  # a head's own width (0 for a draft model)
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class DrafterKV:
    layers: int
    kv_heads: int
    head_dim: int
    max_context: int
    dtype: str = "float32"


@dataclass(frozen=True)
class DrafterEntry:
    kind: str
    name: str
    graph: DrafterGraph | None  # None only for an unknown kind that has none
    kv: DrafterKV | None
    raw: dict = field(repr=False, compare=False)  # the entry as written in specrt.json
    extra_files: tuple[str, ...] = ()  # further files of the drafter (a d2t map)
    source: str = ""  # the checkpoint or model it was converted from
    source_sha256: str | None = None
    vocab_size: int = 0  # logits width of a draft model or DFlash drafter
    draft_vocab_size: int = 0  # logits width of an EAGLE-3/MTP head
    target_hidden_size: int = 0  # width of one target hidden-state tap
    aux_layers: tuple[int, ...] = ()  # EAGLE-3/MTP: the target layers the head reads, in its order
    target_layer_ids: tuple[int, ...] = ()  # DFlash: the target layers the drafter reads, in its order
    block_size: int = 0  # DFlash: tokens per block (the first is the pending token)
    mask_token_id: int = 0  # DFlash: the id that fills the block's unknown positions
    model_config: dict = field(default_factory=dict)  # a draft model's config (ModelConfig.to_dict())

    @property
    def known(self) -> bool:
        """A kind this specrt can run."""
        return self.kind in KINDS

    def files(self) -> set[str]:
        """Every file of the bundle this drafter needs."""
        graph = {self.graph.file, self.graph.data_file} if self.graph else set()
        return graph | set(self.extra_files)


def check_drafter_entries(entries) -> tuple[DrafterEntry, ...]:
    """The manifest's `drafters` list as typed entries (BundleError on the first bad field)."""
    if not isinstance(entries, (list, tuple)):
        raise BundleError(f"specrt.json: 'drafters' must be a list of objects, not {type(entries).__name__}")
    return tuple(_entry(entry, i) for i, entry in enumerate(entries))


def _entry(entry, i: int) -> DrafterEntry:
    if not isinstance(entry, dict):
        raise BundleError(f"specrt.json: drafters[{i}] must be an object, not {type(entry).__name__}")
    kind = entry.get("kind")
    if not _text(kind):
        raise BundleError(f"specrt.json: drafters[{i}] has no 'kind'")
    where = f"specrt.json: the {kind} drafter (drafters[{i}])"
    extra = entry.get("extra_files", [])
    if not (isinstance(extra, list) and all(_text(f) for f in extra)):
        raise BundleError(f"{where}: 'extra_files' must be a list of file names")
    spec = KINDS.get(kind)
    if spec is None:  # from a newer specrt: kept, its files still checked where it names them
        graph = entry.get("graph")
        graph = DrafterGraph(graph["file"], graph["data_file"]) if _object(graph) and all(
            _text(graph.get(k)) for k in GRAPH) else None
        return DrafterEntry(kind, str(entry.get("name", kind)), graph, None, dict(entry), extra_files=tuple(extra))
    _check(entry, {"graph": (_object, "an object"), "kv": (_object, "an object"),
                   **{name: FIELDS[name] for name in spec.entry_fields}}, where)
    graph, kv = entry["graph"], entry["kv"]
    _check(graph, {**GRAPH, **(GRAPH_HIDDEN if spec.head_graph else {})}, f"{where}: graph")
    _check(kv, KV, f"{where}: kv")
    typed = {name: tuple(entry[name]) if isinstance(entry[name], list) else entry[name] for name in spec.entry_fields}
    source_sha256 = entry.get("source_sha256")
    return DrafterEntry(
        kind=kind, name=str(entry.get("name", kind)), raw=dict(entry), extra_files=tuple(extra),
        graph=DrafterGraph(graph["file"], graph["data_file"], graph.get("hidden_size", 0),
                           tuple(graph.get("inputs", ()))),
        kv=DrafterKV(kv["layers"], kv["kv_heads"], kv["head_dim"], kv["max_context"], str(kv.get("dtype", "float32"))),
        source=str(entry.get("source", "")), source_sha256=source_sha256 if isinstance(source_sha256, str) else None,
        **typed)


def _check(part: dict, fields: dict, where: str) -> None:
    for name, (ok, wanted) in fields.items():
        if name not in part:
            raise BundleError(f"{where} lacks '{name}'")
        if not ok(part[name]):
            raise BundleError(f"{where}: '{name}' must be {wanted}, not {part[name]!r:.60}")
