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
    layer_ids: tuple[int, ...] = ()  # the layers that have a KV cache (empty: every layer; hybrids: attention ones)
    # per cached layer (KV heads, head size) where they differ between layers (Gemma 4); empty: kv_heads x head_dim
    layer_shapes: tuple[tuple[int, int], ...] = ()

    def cached_layers(self) -> tuple[int, ...]:
        return self.layer_ids or tuple(range(self.layers))

    def shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head size) of each cached layer, in cached_layers order."""
        return self.layer_shapes or ((self.kv_heads, self.head_dim),) * len(self.cached_layers())


# Transitions per call that a recurrent layer captures, so that the state after any accepted prefix is replayed
# without running the target again (ONNX Runtime's GatedDeltaNet state_update_capacity: at most 8)
CAPTURE_CAPACITY = 8


@dataclass(frozen=True)
class RecurrentStates:
    """The state of linear-attention (Gated DeltaNet) layers: per layer a conv state [B, K - 1, C] (the last
    conv inputs) and a recurrent state [B, Hv, Dv, Dk] (none for short-convolution layers: value_heads 0), graph
    inputs past_conv.{i} / past_recurrent.{i} and outputs present_conv.{i} / present_recurrent.{i}. Each call also
    outputs what replays any prefix of it: capture_conv.{i} [B, S, C] (its conv inputs) and capture_recurrent.{i}
    [B, capacity * (Hv + Hk * Dk + Hv * Dv)] (per token: decay [Hv], key [Hk, Dk], delta [Hv, Dv], ONNX Runtime's
    compact state update)."""

    layers: tuple[int, ...]
    conv_kernel: int
    conv_channels: int
    value_heads: int
    value_dim: int
    key_heads: int
    key_dim: int
    capacity: int = CAPTURE_CAPACITY

    @property
    def conv_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_channels)

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        return (self.value_heads, self.value_dim, self.key_dim)

    @property
    def has_recurrent(self) -> bool:
        """Layers with a recurrent state beside the conv state (Gated DeltaNet); without: short convolutions
        (LFM2), whose only state is the conv's."""
        return self.value_heads > 0

    @property
    def kinds(self) -> tuple[str, ...]:
        """The state kinds each layer has (graph names past_{kind}.{i}, present_{kind}.{i}, capture_{kind}.{i})."""
        return ("conv", "recurrent") if self.has_recurrent else ("conv",)


def parse_states(raw) -> RecurrentStates | None:
    """A manifest's (or a draft model entry's) `states` object as RecurrentStates (None where it has none)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BundleError(f"specrt.json: states must be an object, not {raw!r:.60}")
    try:
        return RecurrentStates(**{**raw, "layers": tuple(raw["layers"])})
    except (KeyError, TypeError) as exc:
        raise BundleError(f"specrt.json: states is malformed ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class TargetGraph:
    file: str
    data_file: str
    precision: str  # fp32 | fp16 | int4 | int8
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    past_key: str = "past_key_values.{i}.key"
    past_value: str = "past_key_values.{i}.value"
    present_key: str = "present.{i}.key"
    present_value: str = "present.{i}.value"
    hidden_layers: tuple[int, ...] = ()  # residual stream after these layers, concatenated
    hidden_size: int = 0
    int4_block_size: int = 0  # int4 graphs: weights per quantization block (0: written before it was recorded, 32)
    exact_attention: bool = False  # attention_min_rows > 1 also computes attention call-invariantly (CPU graphs)
    device: str = "cpu"  # the profile it was built for: cpu, or a GPU's (cuda, rocm: convert/gpu_profile.py)


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
    states: RecurrentStates | None = None  # hybrid models' linear-attention layers

    @property
    def recurrent(self) -> bool:
        """The target carries a recurrent state (rolled back by replaying captured transitions, not by length)."""
        return self.states is not None

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
            d["kv"] = KVLayout(**{**d["kv"], "layer_ids": tuple(d["kv"].get("layer_ids", ())),
                                  "layer_shapes": tuple(tuple(s) for s in d["kv"].get("layer_shapes", ()))})
            d["states"] = parse_states(d.get("states"))
            d["files"] = {k: FileEntry(**v) for k, v in d["files"].items()}
            for key in ("stop_token_ids", "tokenizer_files", "execution_providers"):
                d[key] = tuple(d.get(key, ()))
            d["drafters"] = check_drafter_entries(d.get("drafters", ()))
            manifest = Manifest(**d)
        except (KeyError, TypeError, AttributeError) as exc:
            raise BundleError(f"specrt.json is malformed ({type(exc).__name__}: {exc})") from None
        check_manifest(manifest)
        return manifest


MAX_CONTEXT = 1 << 20  # tokens: no real model's context is longer
# gguf: a GGUF source's own quantized weights, exactly (convert/gguf_exact.py), in 4 or 8 bits by tensor
PRECISIONS = ("fp32", "fp16", "int4", "int8", "gguf")
DEVICES = ("cpu", "cuda", "rocm")  # the graph profiles a target is built for (convert/gpu_profile.py)
# A target graph input, [1] int64: the fewest rows its attentions run (2 pads a one-token call inside the attention,
# so that it rounds as a multi-token call does: convert/attention_rows.py). Graphs written before it lack it.
ATTENTION_ROWS_INPUT = "attention_min_rows"
# A target graph input of mixture-of-experts graphs, [1] int64: 1 runs every token's experts in a call of their own,
# so that a token's output no longer depends on the other tokens of its call (exact calls: convert/moe_graph.py);
# 0 runs the whole call's tokens through the experts at once (faster for calls of several tokens).
EXPERT_CALLS_INPUT = "experts_token_by_token"
# A GPU target graph input, [] int32: past + new tokens (attention_mask's width), GroupQueryAttention's
# total_sequence_length, which its CUDA kernel reads on the host (convert/gpu_profile.py)
TOTAL_LENGTH_INPUT = "total_sequence_length"
# A rocm target graph input, [B] int32, in place of attention_mask: past + new tokens - 1 per row (GroupQueryAttention's
# seqlens_k), so that MIGraphX sees fixed shapes but the call's width
SEQLENS_INPUT = "seqlens_k"
# the block-quantized precisions (MatMulNBits weights, int8 activations); gguf's bits vary by tensor: 4 is what weights
# with no GGUF form of their own (a drafter's safetensors) are quantized to
WEIGHT_BITS = {"int4": 4, "int8": 8, "gguf": 4}


def weight_bits(precision: str) -> int:
    """Bits per weight of a block-quantized precision; 0 for a float one."""
    return WEIGHT_BITS.get(precision, 0)


def _int(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _strings(value) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)


def check_manifest(m: Manifest) -> None:
    """Every field of the manifest typed and in range, every file name a plain relative path (BundleError naming
    the field): a bundle is a file people download and share, so nothing in it is trusted before use."""

    def bad(field: str, value, wanted: str):
        raise BundleError(f"specrt.json: {field} must be {wanted}, not {value!r:.80}")

    t, kv = m.target, m.kv
    for name in ("file", "data_file"):
        if not isinstance(getattr(t, name), str) or not getattr(t, name):
            bad(f"target.{name}", getattr(t, name), "a file name")
    if t.precision not in PRECISIONS:
        bad("target.precision", t.precision, " | ".join(PRECISIONS))
    for name in ("inputs", "outputs"):
        if not _strings(getattr(t, name)):
            bad(f"target.{name}", getattr(t, name), "a list of names")
    if not all(_int(i, 0, 4095) for i in t.hidden_layers):
        bad("target.hidden_layers", list(t.hidden_layers), "a list of layer indices")
    if not _int(t.hidden_size, 0, 1 << 17) or not _int(t.int4_block_size, 0, 1024):
        bad("target.hidden_size / int4_block_size", (t.hidden_size, t.int4_block_size), "non-negative integers")
    if not isinstance(t.exact_attention, bool):
        bad("target.exact_attention", t.exact_attention, "true or false")
    if t.device not in DEVICES:
        bad("target.device", t.device, " | ".join(DEVICES))
    if "hidden_states" in t.outputs and (not t.hidden_layers or t.hidden_size < 1):
        bad("target.hidden_layers / hidden_size", (list(t.hidden_layers), t.hidden_size),
            "set where the graph outputs hidden_states")
    for d in m.drafters:
        if d.target_hidden_size and d.target_hidden_size != t.hidden_size:
            raise BundleError(f"specrt.json: the {d.name} drafter reads hidden states of width {d.target_hidden_size}, "
                              f"the target graph's are {t.hidden_size}")
    for name, high in (("layers", 4096), ("kv_heads", 4096), ("head_dim", 4096), ("max_context", MAX_CONTEXT)):
        if not _int(getattr(kv, name), 1, high):
            bad(f"kv.{name}", getattr(kv, name), f"an integer in 1..{high}")
    if kv.dtype not in ("float32", "float16"):
        bad("kv.dtype", kv.dtype, "float32 | float16")
    if not all(_int(i, 0, kv.layers - 1) for i in kv.layer_ids):
        bad("kv.layer_ids", list(kv.layer_ids), f"layer indices below {kv.layers}")
    if kv.layer_shapes and (len(kv.layer_shapes) != len(kv.cached_layers()) or not all(
            len(s) == 2 and _int(s[0], 1, 4096) and _int(s[1], 1, 4096) for s in kv.layer_shapes)):
        bad("kv.layer_shapes", [list(s) for s in kv.layer_shapes], "a [KV heads, head size] pair per cached layer")
    if m.states is not None:
        st = m.states
        if not st.layers or not all(_int(i, 0, kv.layers - 1) for i in st.layers) or set(st.layers) & set(kv.layer_ids):
            bad("states.layers", list(st.layers), "the layers without a KV cache")
        for name in ("conv_kernel", "conv_channels"):
            if not _int(getattr(st, name), 1 if name != "conv_kernel" else 2, 1 << 17):
                bad(f"states.{name}", getattr(st, name), "a positive integer")
        # a recurrent state of value_heads x value_dim x key_dim (all positive), or none (all 0: short convolutions)
        recurrent = ("value_heads", "value_dim", "key_heads", "key_dim")
        low = 0 if all(_int(getattr(st, name), 0, 0) for name in recurrent) else 1
        for name in recurrent:
            if not _int(getattr(st, name), low, 1 << 17):
                bad(f"states.{name}", getattr(st, name), "a positive integer (or all four 0: no recurrent state)")
        if not _int(st.capacity, 1, CAPTURE_CAPACITY):
            bad("states.capacity", st.capacity, f"an integer in 1..{CAPTURE_CAPACITY}")
    if not isinstance(m.model_config, dict):
        bad("model_config", m.model_config, "an object")
    for name, want in (("num_layers", kv.layers), ("num_kv_heads", kv.kv_heads), ("head_dim", kv.head_dim)):
        if name in m.model_config and m.model_config[name] != want:
            raise BundleError(f"specrt.json: kv says {want} for {name}, model_config says "
                              f"{m.model_config[name]!r:.40} (a hand-edited or mismatched manifest)")
    if not _int(m.model_config.get("sliding_window", 0), 0, MAX_CONTEXT):
        bad("model_config.sliding_window", m.model_config.get("sliding_window"), "a non-negative integer")
    if not _int(m.vocab_size, 1, 1 << 24):
        bad("vocab_size", m.vocab_size, "a positive integer")
    if not all(_int(i, 0, m.vocab_size - 1) for i in m.stop_token_ids):
        bad("stop_token_ids", list(m.stop_token_ids), "token ids of the vocabulary")
    if m.bos_token_id is not None and not _int(m.bos_token_id, 0, m.vocab_size - 1):
        bad("bos_token_id", m.bos_token_id, "a token id or null")
    if m.chat_template is not None and not isinstance(m.chat_template, str):
        bad("chat_template", m.chat_template, "a string or null")
    if not _strings(m.tokenizer_files) or not _strings(m.execution_providers):
        bad("tokenizer_files / execution_providers", (m.tokenizer_files, m.execution_providers), "lists of names")
    if not isinstance(m.files, dict):
        bad("files", m.files, "an object")
    for name, entry in m.files.items():
        check_relative(name)
        if not _int(entry.size, 0, 1 << 50) or not (isinstance(entry.sha256, str) and len(entry.sha256) == 64):
            bad(f"files[{name!r}]", dataclasses.asdict(entry), "{size: bytes, sha256: 64 hex digits}")
    names = {t.file, t.data_file, *m.tokenizer_files}
    for drafter in m.drafters:
        names |= drafter.files()
    for name in names:
        check_relative(name)


def check_relative(name: str) -> None:
    """A file name of the manifest must be a plain relative path inside the bundle: no absolute path, no '..',
    no backslash or drive (checked before anything is opened or even stat'ed)."""
    if (not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts
            or "\\" in name or ":" in name or name.startswith("~")):
        raise BundleError(f"specrt.json names the file {name!r:.80}: only paths inside the bundle are allowed")


def bundle_path(bundle: Path, name: str) -> Path:
    """bundle / name, refused (BundleError) if it leads outside the bundle once symlinks are resolved."""
    check_relative(name)
    root = Path(bundle).resolve()
    path = (root / name).resolve()
    if path != root and root not in path.parents:
        raise BundleError(f"{bundle}: {name} leads outside the bundle (a symlink to {path})")
    return path


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
    except (OSError, ValueError, RecursionError) as exc:
        raise BundleError(f"{path}: unreadable manifest ({type(exc).__name__}: {str(exc)[:200]})") from None
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
        path = bundle_path(bundle, name)
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
