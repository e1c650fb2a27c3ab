"""The manifest's drafter entries (specrt.json `drafters`): the fields each kind must carry, checked when the
manifest is read (standard library only; shared by convert and runtime).

A malformed entry is a one-line BundleError naming the entry and the field, not a KeyError inside a drafter. An
entry of a kind this specrt does not know is kept unchecked (no drafter here can run it).
"""

from __future__ import annotations

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


# field -> (check, what the check wants), per part of an entry
GRAPH = {"file": (_text, "a file name"), "data_file": (_text, "a file name")}
KV = {name: (_positive, "a positive integer") for name in ("layers", "kv_heads", "head_dim", "max_context")}
FEATURE_HEAD = {"draft_vocab_size": (_positive, "a positive integer"),
                "target_hidden_size": (_positive, "a positive integer"),
                "aux_layers": (_indices, "a list of layer indices")}
BY_KIND = {
    "draft-model": {"vocab_size": (_positive, "a positive integer"), "model_config": (_object, "an object")},
    "eagle3": FEATURE_HEAD,
    "mtp": FEATURE_HEAD,
    "dflash": {"block_size": (_positive, "a positive integer"), "mask_token_id": (_index, "a token id"),
               "target_hidden_size": (_positive, "a positive integer"), "vocab_size": (_positive, "a positive integer"),
               "target_layer_ids": (_indices, "a list of layer indices")},
}
GRAPH_HIDDEN = {"hidden_size": (_positive, "a positive integer")}  # the heads' own width (not a draft model's)


def check_drafter_entries(entries) -> tuple[dict, ...]:
    """The manifest's `drafters` list, each entry checked (BundleError on the first bad field)."""
    if not isinstance(entries, (list, tuple)):
        raise BundleError(f"specrt.json: 'drafters' must be a list of objects, not {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise BundleError(f"specrt.json: drafters[{i}] must be an object, not {type(entry).__name__}")
        kind = entry.get("kind")
        if not _text(kind):
            raise BundleError(f"specrt.json: drafters[{i}] has no 'kind'")
        if kind not in BY_KIND:
            continue
        where = f"specrt.json: the {kind} drafter (drafters[{i}])"
        _check(entry, {"graph": (_object, "an object"), "kv": (_object, "an object"), **BY_KIND[kind]}, where)
        _check(entry["graph"], {**GRAPH, **(GRAPH_HIDDEN if kind != "draft-model" else {})}, f"{where}: graph")
        _check(entry["kv"], KV, f"{where}: kv")
        extra = entry.get("extra_files", [])
        if not (isinstance(extra, list) and all(_text(f) for f in extra)):
            raise BundleError(f"{where}: 'extra_files' must be a list of file names")
    return tuple(entries)


def _check(part: dict, fields: dict, where: str) -> None:
    for name, (ok, wanted) in fields.items():
        if name not in part:
            raise BundleError(f"{where} lacks '{name}'")
        if not ok(part[name]):
            raise BundleError(f"{where}: '{name}' must be {wanted}, not {part[name]!r:.60}")
