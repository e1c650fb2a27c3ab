"""Read a GGUF file (llama.cpp's format) into an HF-style config dict and HF-named float32 weights, read lazily.

Through the `gguf` package: GGUFReader reads the header, each tensor's bytes are read when it is used, and
`gguf.quants.dequantize` expands the block formats small models use (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
Q5_K, Q6_K, and the others it knows). What is peculiar to an architecture (its metadata, tensor names, the changes
llama.cpp's converter made to values, such as Llama's permuted q/k rows) is its module's (specrt/archs/).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from specrt import archs
from specrt.errors import SourceError
from specrt.models.tensor_source import LazyWeights, TensorRef, check_inside, file_size

# MXFP4: gpt-oss's experts; the IQ ("i-quant") types: dequantized by gguf-py as ggml does (read as float; under
# --precision gguf quantized again to 8 bits, the nearest form MatMulNBits has for them: convert/gguf_exact.py)
SUPPORTED_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
                         "MXFP4", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M")

# metadata key (after the "<arch>." prefix) -> HF config key
META_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "attention.sliding_window": "sliding_window",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}
# stacked expert tensors (qwen3moe, gpt-oss) -> the projection each expert's slice is
EXPERT_TENSORS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}

# per-block GGUF tensor name -> HF name (model.layers.{i}. prefix added)
BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# the Llama layout's own names (an architecture's module may give others: GGUF_BLOCK_TENSORS)
LLAMA_BLOCK_TENSORS = {**BLOCK_TENSORS, "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate"}
TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


# GGUF value types: fixed-size ones by size; 8 is a string, 9 an array
VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS


def check_header(path: Path) -> None:
    """Walk the header (metadata and tensor infos) checking every declared count, length and type against the
    bytes the file has, before GGUFReader trusts them: a string or array longer than the rest of the file, an
    unknown value type, a tensor with more than 4 dimensions is a SourceError naming the key or tensor, found
    in one pass over the header without allocating what it declares."""
    import mmap
    import struct

    with open(path, "rb") as f:
        size = file_size(path)
        if size < 24:
            raise SourceError(f"{path}: not a GGUF file ({size} bytes)")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if data[:4] != b"GGUF":
                raise SourceError(f"{path}: not a GGUF file (no GGUF magic)")
            version, tensors, kvs = struct.unpack_from("<IQQ", data, 4)
            if version not in (2, 3):
                raise SourceError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            if kvs > size // 13 or tensors > size // 32:
                raise SourceError(f"{path}: declares {kvs} metadata entries and {tensors} tensors, more than its "
                                  f"{size} bytes can hold")
            pos = 24

            def need(n: int, what: str) -> None:
                if n < 0 or pos + n > size:
                    raise SourceError(f"{path}: {what} runs past the end of the file")

            def string(what: str) -> str:
                nonlocal pos
                need(8, what)
                (n,) = struct.unpack_from("<Q", data, pos)
                need(8 + n, what)
                pos += 8 + n
                return bytes(data[pos - n:pos]).decode("utf-8", "replace")

            def value(vtype: int, key: str, depth: int = 0) -> None:
                nonlocal pos
                if vtype in VALUE_SIZES:
                    need(VALUE_SIZES[vtype], f"metadata {key}")
                    pos += VALUE_SIZES[vtype]
                elif vtype == STRING:
                    string(f"metadata {key}")
                elif vtype == ARRAY and depth < 2:
                    need(12, f"metadata {key}")
                    item, count = struct.unpack_from("<IQ", data, pos)
                    pos += 12
                    smallest = VALUE_SIZES.get(item, 8 if item == STRING else 12)
                    if item not in VALUE_SIZES and item not in (STRING, ARRAY):
                        raise SourceError(f"{path}: metadata {key}: unknown array item type {item}")
                    if count * smallest > size - pos:
                        raise SourceError(f"{path}: metadata {key} declares {count} items, more than the rest of "
                                          f"the file can hold")
                    if item in VALUE_SIZES:
                        pos += count * VALUE_SIZES[item]
                    else:
                        for _ in range(count):
                            value(item, key, depth + 1)
                else:
                    raise SourceError(f"{path}: metadata {key}: unknown value type {vtype}")

            for _ in range(kvs):
                key = string("a metadata key")
                need(4, f"metadata {key}")
                (vtype,) = struct.unpack_from("<I", data, pos)
                pos += 4
                value(vtype, key)
            for _ in range(tensors):
                name = string("a tensor name")
                need(4, f"tensor {name}")
                (dims,) = struct.unpack_from("<I", data, pos)
                if not 1 <= dims <= MAX_DIMS:
                    raise SourceError(f"{path}: tensor {name} declares {dims} dimensions (1..{MAX_DIMS})")
                need(4 + 8 * dims + 12, f"tensor {name}")
                shape = struct.unpack_from(f"<{dims}Q", data, pos + 4)
                if not all(1 <= d <= 1 << 40 for d in shape) or math.prod(shape) > 1 << 42:
                    raise SourceError(f"{path}: tensor {name} has an impossible shape {list(shape)}")
                (qtype,) = struct.unpack_from("<I", data, pos + 4 + 8 * dims)
                _check_type_and_rows(path, name, qtype, shape)
                pos += 4 + 8 * dims + 12
        finally:
            data.close()


def _check_type_and_rows(path: Path, name: str, qtype: int, shape: tuple[int, ...]) -> None:
    """A tensor's storage type must be one ggml knows, and its rows (the first, fastest dimension) whole blocks
    of it: else a SourceError naming the tensor and the type."""
    import gguf

    try:
        kind = gguf.GGMLQuantizationType(qtype)
    except ValueError:
        raise SourceError(f"{path}: tensor {name} has an unknown GGML type {qtype}") from None
    block = gguf.GGML_QUANT_SIZES[kind][0]
    if shape[0] % block:
        raise SourceError(f"{path}: tensor {name} ({kind.name}) has rows of {shape[0]} weights, not whole "
                          f"{kind.name} blocks of {block}")


def open_gguf(path: Path):
    """The file's GGUFReader. Its memory map is read for the header only (tensor bytes are read with positioned
    reads, see TensorRef); a tensor whose bytes run past the file's end is an error naming the tensor. The
    header is checked first (check_header)."""
    import gguf

    check_header(path)

    class Reader(gguf.GGUFReader):
        """Builds a placeholder view (no memory) for a tensor past the file's end instead of failing unnamed."""

        _tensors_started = False

        def _build_tensors(self, *args, **kwargs):
            self._tensors_started = True
            return super()._build_tensors(*args, **kwargs)

        def _get(self, offset, dtype, count=1, override_order=None):
            itemsize = np.dtype(dtype).itemsize
            if self._tensors_started and offset + itemsize * int(count) > len(self.data):
                return np.broadcast_to(np.zeros(1, dtype=dtype), (int(count),))  # checked by name below
            return super()._get(offset, dtype, count, override_order)

    try:
        reader = Reader(str(path))
    except Exception as exc:  # the reader raises ValueError, struct errors, IndexError... on bad bytes
        raise SourceError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    size = file_size(path)
    for t in reader.tensors:
        check_inside(TensorRef(t.name, Path(path), int(t.data_offset), int(t.n_bytes), (), None,
                               gguf_type=t.tensor_type.name), size)
    return reader


def field_value(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:
        return default


def gguf_hf_config(reader) -> dict:
    """HF-style config dict from GGUF metadata, read by the module of the file's architecture (specrt/archs/)."""
    name = field_value(reader, "general.architecture")
    arch = archs.for_gguf(name)
    read = arch.hook("gguf_config")
    hf = read(reader, name) if read else common_config(reader, name)
    return _with_common(reader, hf, name, arch)


def common_config(reader, name: str) -> dict:
    """The metadata most architectures write under the same keys (META_KEYS), as HF config keys."""
    hf = {"model_type": archs.for_gguf(name).gguf[name]}
    for key, hf_key in META_KEYS.items():
        value = field_value(reader, f"{name}.{key}")
        if value is not None:
            hf[hf_key] = value
    return hf


def _with_common(reader, hf: dict, name: str, arch) -> dict:
    """The fields every architecture takes from the file itself (vocabulary, tied head, special ids), after the
    block count is checked against the tensors (an MTP module's block follows the layers: mtp_num_hidden_layers),
    then what the architecture fixes (its module's gguf_fixups)."""
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise SourceError(f"the GGUF file has no token_embd.weight tensor ({len(names)} tensors)")
    blocks = {int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.split(".")[1].isdigit()}
    declared = hf.get("num_hidden_layers")
    if isinstance(declared, int):
        declared += hf.get("mtp_num_hidden_layers", 0)
    if declared is not None and (not isinstance(declared, int) or declared != len(blocks)
                                 or blocks != set(range(len(blocks)))):
        raise SourceError(f"GGUF metadata {name}.block_count = {declared!r}, but the file holds tensors for "
                          f"{len(blocks)} blocks")
    hf.setdefault("vocab_size", int(embd.shape[-1]))
    hf["tie_word_embeddings"] = "output.weight" not in names
    fix = arch.hook("gguf_fixups")
    if fix is not None:
        fix(reader, hf, names, blocks)
    for key, hf_key in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")):
        value = field_value(reader, key)
        if value is not None:
            hf[hf_key] = int(value)
    from specrt.models.config import config_from_hf

    config_from_hf(hf)  # counts, eps and theta in range (a SourceError naming the field)
    return hf


def tensor_data(reader, name: str):
    """A (small) tensor's values as stored, or None where the file has no such tensor."""
    t = next((t for t in reader.tensors if t.name == name), None)
    return None if t is None else np.asarray(t.data)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> half split)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str, block_map: dict, top_map: dict = TOP_TENSORS) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")  # suffix: weight | bias
    if base.startswith("blk."):
        parts = base.split(".", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            return None  # not a block tensor specrt knows (converted models need none of those)
        _, idx, kind = parts
        hf = block_map.get(kind)
        return f"model.layers.{idx}.{hf}.{suffix}" if hf else None
    hf = top_map.get(base)
    return f"{hf}.{suffix}" if hf else None


def check_supported(t) -> None:
    """A GGUF tensor specrt reads must be in a storage type it decodes (a SourceError naming the tensor)."""
    if t.tensor_type.name not in SUPPORTED_QUANT_TYPES:
        raise SourceError(f"tensor {t.name}: GGUF type {t.tensor_type.name} is not supported "
                          f"(supported: {', '.join(SUPPORTED_QUANT_TYPES)})")


def decoder(qtype, after=None):
    """raw bytes of (whole rows of) a GGUF tensor -> float32 array [rows, cols] (numpy order), then `after` (an
    undoing of llama.cpp's converter) if given."""
    import gguf

    if qtype.name not in SUPPORTED_QUANT_TYPES:
        raise ValueError(f"GGUF type {qtype.name} is not supported")

    def decode(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        if qtype == gguf.GGMLQuantizationType.F32:
            arr = np.frombuffer(raw, dtype=np.float32).copy()
        elif qtype == gguf.GGMLQuantizationType.F16:
            arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
        else:
            blocks = np.frombuffer(raw, dtype=np.uint8).reshape(gguf.quant_shape_to_byte_shape(shape, qtype))
            arr = gguf.quants.dequantize(blocks, qtype).astype(np.float32, copy=False)
        if arr.size != count:
            raise SourceError(f"{arr.size} values where its shape {shape} needs {count}")
        arr = arr.reshape(shape)
        return after(arr) if after is not None else arr

    return decode


def load_gguf(path: Path) -> tuple[dict, LazyWeights, object]:
    """Returns (HF-style config dict, HF-named float32 weights read lazily, the open reader for metadata)."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    reader = open_gguf(path)
    hf = gguf_hf_config(reader)
    arch = archs.for_gguf(field_value(reader, "general.architecture"))
    own = arch.hook("gguf_refs")  # a layout that needs more than renaming reads its tensors itself
    if own is not None:
        return hf, LazyWeights(own(path, reader, hf)), reader
    block_map = arch.hook("GGUF_BLOCK_TENSORS", LLAMA_BLOCK_TENSORS)
    top_map = arch.hook("GGUF_TOP_TENSORS", TOP_TENSORS)
    undo = arch.hook("gguf_undo")  # (hf name, shape, hf, gguf name) -> (function, elementwise) or None
    refs: dict[str, TensorRef] = {}
    for t in reader.tensors:
        kind = t.name.split(".")[2] if t.name.startswith("blk.") and t.name.count(".") >= 3 else ""
        if kind in EXPERT_TENSORS:  # stacked experts [E, rows, cols]: each expert's bytes are contiguous
            refs.update(expert_refs(path, t, EXPERT_TENSORS[kind]))
            continue
        if kind == "attn_sinks":  # one logit per head; HF names it without a .weight
            refs[f"model.layers.{t.name.split('.')[1]}.self_attn.sinks"] = TensorRef(
                t.name, path, int(t.data_offset), int(t.n_bytes), tuple(int(x) for x in reversed(t.shape)),
                decoder(t.tensor_type))
            continue
        name = _hf_name(t.name, block_map, top_map)
        if name is None:
            continue  # rope_freqs and other tensors the HF layout recomputes
        check_supported(t)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        after, elementwise = (undo(name, shape, hf, t.name) if undo else None) or (None, False)
        # an elementwise undoing keeps rows apart; a row reordering is applied after reading whole rows
        refs[name] = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape,
                               decoder(t.tensor_type, after), rows_apart=after is None or elementwise,
                               gguf_type=t.tensor_type.name, reorder=None if elementwise else after)
    split = arch.hook("gguf_split")  # fused tensors read one part at a time (Phi-3's attn_qkv, ffn_up)
    if split is not None:
        refs = split(refs, hf)
    _check_shapes(hf, refs)
    return hf, LazyWeights(refs), reader


def expert_refs(path: Path, t, proj: str) -> dict[str, TensorRef]:
    """One stacked expert tensor (blk.{i}.ffn_{gate,up,down}_exps.weight [E, rows, cols], or gpt-oss's .bias
    [E, rows]) as model.layers.{i}.mlp.experts.{e}.{proj}.weight / .bias, each read from its own expert's bytes."""
    check_supported(t)
    shape = tuple(int(x) for x in reversed(t.shape))  # weights [E, rows, cols]; gpt-oss's biases [E, rows]
    suffix = t.name.rpartition(".")[2]
    if len(shape) != (3 if suffix == "weight" else 2) or int(t.n_bytes) % shape[0]:
        want = "[experts, rows, columns]" if suffix == "weight" else "[experts, rows]"
        raise SourceError(f"tensor {t.name} has shape {list(shape)}, expected {want}")
    stacked = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape, decoder(t.tensor_type),
                        gguf_type=t.tensor_type.name)
    return {f"model.layers.{t.name.split('.')[1]}.mlp.experts.{e}.{proj}.{suffix}": stacked.expert(e, shape[1:])
            for e in range(shape[0])}


def _check_shapes(hf: dict, refs: dict[str, TensorRef]) -> None:
    """Each weight's shape against the metadata that implies it (a file whose metadata and tensors disagree is
    a SourceError naming both, before conversion builds anything from them)."""
    from specrt.models.config import config_from_hf

    c = config_from_hf(hf)
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    want = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size), "lm_head.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        want.update({p + "self_attn.q_proj.weight": (q, c.hidden_size), p + "self_attn.k_proj.weight": (kv, c.hidden_size),
                     p + "self_attn.v_proj.weight": (kv, c.hidden_size), p + "self_attn.o_proj.weight": (c.hidden_size, q),
                     p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
                     p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
                     p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size)})
    for name, shape in want.items():
        if name in refs and tuple(refs[name].shape) != shape:
            raise SourceError(f"tensor {refs[name].name} has shape {list(refs[name].shape)}, but the GGUF metadata "
                              f"(embedding_length, head counts, key_length, feed_forward_length, vocab) implies "
                              f"{list(shape)}")
    missing = [n for n in ("model.embed_tokens.weight",) + tuple(f"model.layers.{i}.self_attn.q_proj.weight"
                                                                  for i in c.attention_layers) if n not in refs]
    if missing:
        raise SourceError(f"the GGUF file lacks the tensor for {missing[0]} (block_count {c.num_layers})")
    for i in c.state_layers:  # a conv layer's tensors (LFM2's short convolutions)
        if not any(n.startswith(f"model.layers.{i}.conv.") or n.startswith(f"model.layers.{i}.linear_attn.")
                   for n in refs):
            raise SourceError(f"the GGUF file has no conv tensors for layer {i}, which its metadata makes a conv layer")
