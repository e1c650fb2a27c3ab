"""Read a GGUF file (llama.cpp's format) into an HF-style config dict and HF-named float32 weights, read lazily.

Through the `gguf` package: GGUFReader reads the header, each tensor's bytes are read when it is used, and
`gguf.quants.dequantize` expands the block formats small models use (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
Q5_K, Q6_K, and the others it knows). Two undoings of llama.cpp's converter: Llama/Mistral q/k rows were permuted to
interleaved rotary order (reversed here), and Gemma norm weights were stored as 1 + w.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from specrt.errors import SourceError
from specrt.models import gguf_gemma4, gguf_qwen35
from specrt.models.tensor_source import LazyWeights, TensorRef, check_inside, file_size

# MXFP4: gpt-oss's experts; the IQ ("i-quant") types: dequantized by gguf-py as ggml does (read as float; under
# --precision gguf quantized again to 8 bits, the nearest form MatMulNBits has for them: convert/gguf_exact.py)
SUPPORTED_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
                         "MXFP4", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M")

# GGUF architecture -> HF model_type
GGUF_ARCHS = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text",
              "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text",  # models/gguf_qwen35.py
              "qwen3moe": "qwen3_moe",  # experts stacked [E, rows, cols] per tensor: read one expert at a time
              "gpt-oss": "gpt_oss",  # + sinks, biased experts (docs/research-gguf-moe-layouts.md)
              "gemma4": "gemma4_text"}  # models/gguf_gemma4.py

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
# qwen3moe's stacked expert tensors -> the projection each expert's slice is
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
GEMMA_BLOCK_TENSORS = {
    **BLOCK_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
LLAMA_BLOCK_TENSORS = {**BLOCK_TENSORS, "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate"}
# gpt-oss: its pre-MoE norm is written as post_attention_norm, its sinks as attn_sinks.weight (HF: self_attn.sinks)
GPT_OSS_BLOCK_TENSORS = {**LLAMA_BLOCK_TENSORS, "post_attention_norm": "post_attention_layernorm"}
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
    """HF-style config dict from GGUF metadata."""
    arch = field_value(reader, "general.architecture")
    if arch not in GGUF_ARCHS:
        raise SourceError(f"unsupported GGUF architecture {arch!r} (supported: {', '.join(GGUF_ARCHS)})")
    if arch in gguf_qwen35.ARCHS:
        return _with_common(reader, gguf_qwen35.hf_config(reader, field_value, arch), arch, extra_blocks=True)
    if arch == gguf_gemma4.ARCH:
        hf = gguf_gemma4.hf_config(reader, field_value, lambda name: _tensor_data(reader, name))
        return _with_common(reader, gguf_gemma4.finish(hf, {t.name for t in reader.tensors}), arch)
    hf = {"model_type": GGUF_ARCHS[arch]}
    for key, hf_key in META_KEYS.items():
        value = field_value(reader, f"{arch}.{key}")
        if value is not None:
            hf[hf_key] = value
    return _with_common(reader, hf, arch)


def _with_common(reader, hf: dict, arch: str, extra_blocks: bool = False) -> dict:
    """The fields every architecture takes from the file itself (vocabulary, tied head, special ids), after the
    block count is checked against the tensors (extra_blocks: the MTP module's block follows the layers)."""
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise SourceError(f"the GGUF file has no token_embd.weight tensor ({len(names)} tensors)")
    blocks = {int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.split(".")[1].isdigit()}
    declared = hf.get("num_hidden_layers")
    if extra_blocks and declared is not None:
        declared += hf.get("mtp_num_hidden_layers", 0)
    if declared is not None and (not isinstance(declared, int) or declared != len(blocks)
                                 or blocks != set(range(len(blocks)))):
        raise SourceError(f"GGUF metadata {arch}.block_count = {declared!r}, but the file holds tensors for "
                          f"{len(blocks)} blocks")
    hf.setdefault("vocab_size", int(embd.shape[-1]))
    hf["tie_word_embeddings"] = "output.weight" not in names
    if arch == "qwen2":
        hf["attention_bias"] = "blk.0.attn_q.bias" in names
    if arch == "gpt-oss":  # fixed by the architecture in llama.cpp: biases everywhere, even layers sliding, yarn
        hf["attention_bias"] = True
        hf.setdefault("intermediate_size", hf.get("moe_intermediate_size"))
        hf["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(len(blocks))]
        if field_value(reader, "gpt-oss.rope.scaling.type") == "yarn":
            hf["rope_scaling"] = {
                "rope_type": "yarn", "factor": float(field_value(reader, "gpt-oss.rope.scaling.factor", 1.0)),
                "original_max_position_embeddings": int(field_value(
                    reader, "gpt-oss.rope.scaling.original_context_length", 4096)),
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    if arch == "qwen3moe":  # llama.cpp divides the top-k routing weights by their sum (as Qwen3-30B-A3B's config)
        hf["norm_topk_prob"] = True
        # a block without a router keeps a dense MLP (HF's mlp_only_layers; llama.cpp's own files have none)
        hf["mlp_only_layers"] = sorted(i for i in blocks if f"blk.{i}.ffn_gate_inp.weight" not in names)
    if arch == "gemma3":
        hf["hidden_activation"] = "gelu_pytorch_tanh"
        hf.setdefault("head_dim", 256)
        hf["query_pre_attn_scalar"] = hf["head_dim"]
        hf["rope_local_base_freq"] = 10000.0
        hf.setdefault("rope_theta", 1_000_000.0)
        hf["sliding_window_pattern"] = 6
    for key, hf_key in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")):
        value = field_value(reader, key)
        if value is not None:
            hf[hf_key] = int(value)
    from specrt.models.config import config_from_hf

    config_from_hf(hf)  # counts, eps and theta in range (a SourceError naming the field)
    return hf


def _tensor_data(reader, name: str):
    """A (small) tensor's values as stored, or None where the file has no such tensor."""
    t = next((t for t in reader.tensors if t.name == name), None)
    return None if t is None else np.asarray(t.data)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> half split)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str, block_map: dict) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")  # suffix: weight | bias
    if base.startswith("blk."):
        parts = base.split(".", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            return None  # not a block tensor specrt knows (converted models need none of those)
        _, idx, kind = parts
        hf = block_map.get(kind)
        return f"model.layers.{idx}.{hf}.{suffix}" if hf else None
    hf = TOP_TENSORS.get(base)
    return f"{hf}.{suffix}" if hf else None


def _check_supported(t) -> None:
    """A GGUF tensor specrt reads must be in a storage type it decodes (a SourceError naming the tensor)."""
    if t.tensor_type.name not in SUPPORTED_QUANT_TYPES:
        raise SourceError(f"tensor {t.name}: GGUF type {t.tensor_type.name} is not supported "
                          f"(supported: {', '.join(SUPPORTED_QUANT_TYPES)})")


def _decoder(qtype, after=None):
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
    arch = field_value(reader, "general.architecture")
    block_map = {"gemma3": GEMMA_BLOCK_TENSORS, "gpt-oss": GPT_OSS_BLOCK_TENSORS}.get(arch, LLAMA_BLOCK_TENSORS)
    refs: dict[str, TensorRef] = {}
    if arch == gguf_gemma4.ARCH:
        return hf, LazyWeights(_gemma4_refs(path, reader)), reader
    for t in reader.tensors:
        kind = t.name.split(".")[2] if t.name.startswith("blk.") and t.name.count(".") >= 3 else ""
        if arch in gguf_qwen35.ARCHS:
            if kind in gguf_qwen35.EXPERTS or kind == gguf_qwen35.FUSED_EXPERTS:
                refs.update(_qwen35_expert_refs(path, t, hf))
                continue
            found = gguf_qwen35.hf_tensor(t.name, hf)
            if found is None:
                continue
            name, after = found
            _check_supported(t)
            shape = tuple(int(x) for x in reversed(t.shape))
            if name.endswith("conv1d.weight") and len(shape) == 2:
                shape = (shape[0], 1, shape[1])  # stored squeezed [C, K]; HF's depthwise conv weight is [C, 1, K]
            if name.endswith("shared_expert_gate.weight") and len(shape) == 1:
                shape = (1, shape[0])  # one row, stored as a vector
            reorder = after if kind in gguf_qwen35.REORDERING else None
            refs[name] = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape,
                                   _decoder(t.tensor_type, after), rows_apart=after is None,
                                   gguf_type=t.tensor_type.name, reorder=reorder)
            continue
        if kind in EXPERT_TENSORS:  # stacked experts [E, rows, cols]: each expert's bytes are contiguous
            refs.update(_expert_refs(path, t, EXPERT_TENSORS[kind]))
            continue
        if kind == "attn_sinks":  # one logit per head; HF names it without a .weight
            refs[f"model.layers.{t.name.split('.')[1]}.self_attn.sinks"] = TensorRef(
                t.name, path, int(t.data_offset), int(t.n_bytes), tuple(int(x) for x in reversed(t.shape)),
                _decoder(t.tensor_type))
            continue
        name = _hf_name(t.name, block_map)
        if name is None:
            continue  # rope_freqs and other tensors the HF layout recomputes
        _check_supported(t)
        after = None
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        if arch in ("llama", "mistral") and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = hf["num_attention_heads"] if "q_proj" in name else hf.get("num_key_value_heads",
                                                                               hf["num_attention_heads"])
            if shape[0] % (2 * heads):
                raise SourceError(f"tensor {t.name} has {shape[0]} rows, which {heads} heads of an even width "
                                  f"cannot split (GGUF metadata attention.head_count / head_count_kv)")
        if arch in ("llama", "mistral") and name.endswith(("q_proj.weight", "q_proj.bias")):
            after = functools.partial(_unpermute, n_head=hf["num_attention_heads"])
        elif arch in ("llama", "mistral") and name.endswith(("k_proj.weight", "k_proj.bias")):
            after = functools.partial(_unpermute, n_head=hf.get("num_key_value_heads", hf["num_attention_heads"]))
        elif arch == "gemma3" and "norm" in name:
            after = _minus_one
        refs[name] = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape,
                               _decoder(t.tensor_type, after), rows_apart=after is None or after is _minus_one,
                               gguf_type=t.tensor_type.name, reorder=None if after is _minus_one else after)
    if arch not in gguf_qwen35.ARCHS:  # a qwen35 file's tensors are checked against its config by the converter
        _check_shapes(hf, refs)
    return hf, LazyWeights(refs), reader


def _gemma4_refs(path: Path, reader) -> dict[str, TensorRef]:
    """A gemma4 file's tensors under HF names (models/gguf_gemma4.py); the stacked experts an expert at a time."""
    refs: dict[str, TensorRef] = {}
    for t in reader.tensors:
        base, _, suffix = t.name.rpartition(".")
        shape = tuple(int(x) for x in reversed(t.shape))
        if base.startswith("blk."):
            _, block, kind = base.split(".", 2)
            if kind in gguf_gemma4.FUSED_EXPERTS and suffix == "weight":  # Gemma 4's experts sit beside its MLP
                refs.update({name.replace(".mlp.experts.", ".experts.", 1): ref for name, ref in
                             _expert_refs(path, t, gguf_gemma4.FUSED_EXPERTS[kind]).items()})
                continue
            name = gguf_gemma4.block_name(kind, suffix)
            name = f"model.layers.{block}.{name}" if name else None
        else:
            top = gguf_gemma4.TOP.get(base)
            name = f"{top}.{suffix}" if top else None
        if name is None:
            continue  # rope_freqs (read into the config) and tensors specrt does not use
        _check_supported(t)
        refs[name] = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape, _decoder(t.tensor_type),
                               gguf_type=t.tensor_type.name)
    return refs


def _expert_refs(path: Path, t, proj: str) -> dict[str, TensorRef]:
    """One stacked expert tensor (blk.{i}.ffn_{gate,up,down}_exps.weight [E, rows, cols], or gpt-oss's .bias
    [E, rows]) as model.layers.{i}.mlp.experts.{e}.{proj}.weight / .bias, each read from its own expert's bytes."""
    _check_supported(t)
    shape = tuple(int(x) for x in reversed(t.shape))  # weights [E, rows, cols]; gpt-oss's biases [E, rows]
    suffix = t.name.rpartition(".")[2]
    if len(shape) != (3 if suffix == "weight" else 2) or int(t.n_bytes) % shape[0]:
        want = "[experts, rows, columns]" if suffix == "weight" else "[experts, rows]"
        raise SourceError(f"tensor {t.name} has shape {list(shape)}, expected {want}")
    stacked = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), shape, _decoder(t.tensor_type))
    return {f"model.layers.{t.name.split('.')[1]}.mlp.experts.{e}.{proj}.{suffix}": stacked.expert(e, shape[1:])
            for e in range(shape[0])}


def _qwen35_expert_refs(path: Path, t, hf: dict) -> dict[str, TensorRef]:
    """A qwen35moe block's stacked experts (ffn_{gate,up,down}_exps [E, rows, cols], or ffn_gate_up_exps [E, 2 x
    rows, cols]: each expert's gate rows, then its up rows) as per-expert HF tensors; the block after the layers
    is the MTP module's."""
    block = int(t.name.split(".")[1])
    if block > hf["num_hidden_layers"]:
        return {}  # a second MTP module: only the first is read
    prefix = "model.mtp.layers.0" if block == hf["num_hidden_layers"] else f"model.layers.{block}"
    kind = t.name.split(".")[2]
    if kind != gguf_qwen35.FUSED_EXPERTS:
        return {name.replace(f"model.layers.{block}", prefix, 1): ref
                for name, ref in _expert_refs(path, t, gguf_qwen35.EXPERTS[kind]).items()}
    _check_supported(t)
    experts, rows, cols = tuple(int(x) for x in reversed(t.shape)) if len(t.shape) == 3 else (0, 0, 0)
    if not experts or rows % 2 or int(t.n_bytes) % (2 * experts):
        raise SourceError(f"tensor {t.name} has shape {list(reversed([int(x) for x in t.shape]))}, expected "
                          f"[experts, 2 x expert rows, columns]")
    # as 2E stacked halves: half 2e is expert e's gate rows, half 2e + 1 its up rows
    halves = TensorRef(t.name, path, int(t.data_offset), int(t.n_bytes), (2 * experts, rows // 2, cols),
                       _decoder(t.tensor_type))
    out = {}
    for e in range(experts):
        out[f"{prefix}.mlp.experts.{e}.gate_proj.weight"] = halves.expert(2 * e, (rows // 2, cols))
        out[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = halves.expert(2 * e + 1, (rows // 2, cols))
    return out


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
                                                                  for i in range(c.num_layers)) if n not in refs]
    if missing:
        raise SourceError(f"the GGUF file lacks the tensor for {missing[0]} (block_count {c.num_layers})")


def _minus_one(w: np.ndarray) -> np.ndarray:
    """Gemma's norms are stored as 1 + w."""
    return w - 1.0
