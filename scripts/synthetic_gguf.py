"""Write an HF llama-family, Qwen3-MoE, Qwen3.5 or Gemma 4 folder (e.g. scripts/synthetic_model.py's target), or a
preset drawn directly, as a GGUF for llama.cpp, streaming: one tensor is read, quantized and written at a time. A
Qwen3.5 folder becomes llama.cpp's qwen35 layout (archs/qwen3_5_gguf.py; its MTP module and vision tower left out:
plain decoding is compared); a Gemma 4 folder its gemma4 layout (archs/gemma4_gguf.py: rope_freqs added, experts
stacked, the shared layers' unread k/v left out).

    python scripts/synthetic_gguf.py FOLDER OUT.gguf
    python scripts/synthetic_gguf.py --preset gemma4-26b-a4b OUT   # no bf16 folder: OUT/target.gguf drawn directly
                                                                   # (+ OUT/tokenizer, OUT/assistant)
    python scripts/synthetic_gguf.py --preset llama-3.1-8b --quant q4_k_m OUT   # llama.cpp's Q4_K_M mix

With --preset the weights are drawn tensor by tensor (each from a generator seeded by its name, with
scripts/synthetic_model.py's values) and quantized as they are drawn: a model whose bf16 folder would not fit on the
disk (26B-A4B: 50 GB) is written as its 14 GB GGUF, which both llama.cpp and `specrt convert` read.

--quant q4_0 (the default): every matrix becomes Q4_0 (32 weights per block: an fp16 scale and 4-bit values), every
norm stays F32; the same random weights as a specrt bundle of the folder, at about the same bits per weight (4.5).
--quant q4_k_m: llama.cpp's Q4_K_M types per tensor, filled with random valid blocks (scripts/synthetic_kquants.py;
the drawn values are not read for those). Either way q/k rows are permuted to llama.cpp's interleaved rotary order,
and the tokenizer's vocabulary goes in as a BPE ("gpt2") token list, so that plain decoding speed compares engine
with engine on one file.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(folder: str, out: str, loaded=None, quant: str = "q4_0", seed: int = 0) -> None:
    import gguf

    sys.path.append(str(ROOT))
    from specrt.convert import sources
    from tests.gguf_writer import gguf_name, llama_cpp_permute

    folder_path = Path(folder)
    loaded = loaded or sources.load(sources.resolve(folder))
    hf, cfg = loaded.hf_config, loaded.config
    file_type = {"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}[quant]
    kw = {"seed": seed}
    if quant == "q4_k_m":
        sys.path.append(str(ROOT / "scripts"))
        from synthetic_kquants import Q4KMix

        kw["mix"] = lambda names: Q4KMix(names, cfg.num_layers)
    hybrid = cfg.family == "qwen3_5"
    if hybrid:
        from specrt.archs import qwen3_5_gguf as gguf_qwen35

        text = hf.get("text_config", hf)
        writer = gguf.GGUFWriter(out, gguf_qwen35.ARCH)
        gguf_qwen35.write_metadata(writer, {**text, "model_type": "qwen3_5_text"}, mtp_layers=0)
        writer.add_file_type(file_type)
        _tokenizer(writer, folder_path, cfg, gguf)
        _tensors(writer, loaded, gguf, lambda name: gguf_qwen35.gguf_name(name, text)[0],
                 lambda name, w: gguf_qwen35.gguf_tensor(name, w, text)[1],
                 skip=lambda name: name.startswith(("model.mtp.", "model.visual.")), **kw)
        print(f"{out}: {Path(out).stat().st_size / 2**30:.2f} GiB", file=sys.stderr)
        return
    if cfg.family == "gemma4":
        from specrt.archs import gemma4_gguf as gguf_gemma4

        writer = gguf.GGUFWriter(out, gguf_gemma4.ARCH)
        gguf_gemma4.write_metadata(writer, hf, cfg)
        writer.add_file_type(file_type)
        _tokenizer(writer, folder_path, cfg, gguf)

        def unread(name: str) -> bool:  # a shared layer's k/v (the published checkpoint keeps them; nothing reads them)
            m = re.match(r"model\.layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm)\.weight$", name)
            return m is not None and cfg.kv_source(int(m.group(1))) != int(m.group(1))

        def gemma4_name(name: str) -> str:
            m = re.match(r"model\.layers\.(\d+)\.experts\.\d+\.(gate_up_proj|down_proj)\.weight$", name)
            if m:
                kind = next(k for k, v in gguf_gemma4.FUSED_EXPERTS.items() if v == m.group(2))
                return f"blk.{m.group(1)}.{kind}.weight"
            return gguf_gemma4.gguf_name(name)

        _tensors(writer, loaded, gguf, gemma4_name, lambda name, w: np.ascontiguousarray(w, dtype=np.float32),
                 skip=lambda name: unread(name) or name == "lm_head.weight",
                 extra={gguf_gemma4.ROPE_FREQS: gguf_gemma4.rope_freqs(cfg)}, **kw)
        print(f"{out}: {Path(out).stat().st_size / 2**30:.2f} GiB", file=sys.stderr)
        return
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}[cfg.model_type]
    writer = gguf.GGUFWriter(out, arch)
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(min(cfg.max_position, 8192))
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(hf.get("rope_theta", 10000.0)))
    writer.add_file_type(file_type)
    if cfg.num_experts:  # qwen3moe: each projection's experts stacked in one tensor, the router as ffn_gate_inp
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.experts_per_token)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    _tokenizer(writer, folder_path, cfg, gguf)

    def value(name: str, w: np.ndarray) -> np.ndarray:  # llama.cpp's q/k row order (interleaved rotary pairs)
        w = np.ascontiguousarray(w, dtype=np.float32)
        if name.endswith("q_proj.weight"):
            return llama_cpp_permute(w, cfg.num_heads)
        if name.endswith("k_proj.weight"):
            return llama_cpp_permute(w, cfg.num_kv_heads)
        return w

    def name_of(name: str) -> str:
        m = re.match(r"model\.layers\.(\d+)\.mlp\.(?:experts\.\d+\.(gate|up|down)_proj|(gate))\.weight$", name)
        if m is None:
            return gguf_name(name)
        return f"blk.{m.group(1)}.ffn_{m.group(2)}_exps.weight" if m.group(2) else f"blk.{m.group(1)}.ffn_gate_inp.weight"

    _tensors(writer, loaded, gguf, name_of, value, skip=lambda name: False, **kw)
    print(f"{out}: {Path(out).stat().st_size / 2**30:.2f} GiB", file=sys.stderr)


def _tokenizer(writer, folder_path: Path, cfg, gguf) -> None:
    """The folder's tokenizer as a gpt2-style token list (prompts reach llama.cpp as ids: its tokenizer decides
    nothing), with the one merge llama.cpp needs."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder_path / "tokenizer.json"))
    by_id = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    tokens = [t for t, _ in by_id]
    spare = next(i for i, t in enumerate(tokens) if t.startswith("<|placeholder_"))
    tokens[spare] = "\u0120\u0120"
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in by_id])
    writer.add_token_merges(["\u0120 \u0120"])
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_ids[0])


def _tensors(writer, loaded, gguf, name_of, value_of, skip, extra: dict | None = None, mix=None,
             seed: int = 0) -> None:
    """Every weight under name_of(hf_name) with value_of(hf_name, array), header first, then one tensor at a time;
    the weights that share a GGUF name (an MoE layer's experts) are stacked into one [E, rows, cols] tensor in their
    order; `extra` (GGUF name -> array) adds F32 tensors the weights lack (Gemma 4's rope_freqs). Without `mix`
    every matrix is quantized to Q4_0 (the conv weight and 1-D tensors F32); with one (synthetic_kquants.Q4KMix)
    each tensor gets the type it names, a K-quant one filled with random valid blocks (no weights read)."""
    members: dict[str, list[str]] = {}
    for name in loaded.weights:
        if not skip(name):
            members.setdefault(name_of(name), []).append(name)
    if mix is not None:
        mix = mix(list(members))
    infos = []
    for gname, names in members.items():
        if len(names) > 1:  # experts: numeric order (experts.10 after experts.9)
            names.sort(key=lambda n: int(re.search(r"experts\.(\d+)\.", n).group(1)))
        shape = tuple(loaded.weights.shape(names[0]))
        conv = names[0].endswith("conv1d.weight")
        stored = (shape[0], shape[2]) if conv else shape  # the conv weight is stored squeezed
        stored = (len(names), *stored) if len(names) > 1 else stored
        if mix is None:
            qname = "Q4_0" if len(stored) >= 2 and not conv else "F32"
        else:
            qname = mix(gname, stored, conv)
        infos.append((names, gname, stored, getattr(gguf.GGMLQuantizationType, qname)))
    for gname, array in (extra or {}).items():
        infos.append(([], gname, tuple(array.shape), gguf.GGMLQuantizationType.F32))
    for _, gname, stored, qtype in infos:
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor_info(gname, stored, np.dtype(np.float32), 4 * int(np.prod(stored)))
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(stored, qtype)
            writer.add_tensor_info(gname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for k, (names, gname, stored, qtype) in enumerate(infos, 1):
        if not names:
            writer.write_tensor_data(np.ascontiguousarray(extra[gname], dtype=np.float32))
        elif mix is not None and qtype != gguf.GGMLQuantizationType.F32:
            from synthetic_kquants import random_blocks

            writer.write_tensor_data(random_blocks(gname, stored, qtype.name, seed))
        else:
            parts = []
            for name in names:
                w = value_of(name, loaded.weights[name])
                parts.append(gguf.quants.quantize(w, qtype) if qtype != gguf.GGMLQuantizationType.F32 else w)
            writer.write_tensor_data(parts[0] if len(parts) == 1 else np.stack(parts))
        if k % 40 == 0 or k == len(infos):
            print(f"{k}/{len(infos)} tensors", file=sys.stderr)
    writer.close()


class DrawnWeights:
    """HF name -> float32 array drawn on every read from a generator seeded by the name (the same values each time),
    with scripts/synthetic_model.py's value ranges; fused experts as per-expert tensors, as the loaders read them."""

    def __init__(self, tensors: list, seed: int):
        from specrt.models.hf_loader import hf_name

        self._tensors, self._seed = {}, seed
        for t in tensors:
            if len(t.shape) == 3 and t.kind == "matrix" and ".experts." in t.name:  # fused experts [E, out, in]
                stem, kind = t.name.rsplit(".", 1)
                for e in range(t.shape[0]):
                    self._tensors[hf_name(f"{stem}.{e}.{kind}.weight")] = type(t)(
                        f"{stem}.{e}.{kind}.weight", t.shape[1:], t.kind, t.dtype)
            else:
                self._tensors[hf_name(t.name)] = t

    def __iter__(self):
        return iter(self._tensors)

    def __contains__(self, name) -> bool:
        return name in self._tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def __getitem__(self, name: str) -> np.ndarray:
        import zlib

        from synthetic_model import _chunks

        t = self._tensors[name]
        rng = np.random.default_rng([self._seed, zlib.crc32(name.encode())])
        bits = np.frombuffer(b"".join(_chunks(t, rng, {})), dtype=np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32).reshape(t.shape)


def main_preset(preset: str, out: Path, layers: int | None, seed: int, quant: str = "q4_0") -> None:
    """OUT/tokenizer (config + tokenizer, no weights), OUT/target.gguf drawn directly, OUT/<drafter> (its HF folder)."""
    import json

    sys.path.append(str(ROOT))
    sys.path.append(str(ROOT / "scripts"))
    import synthetic_model as sm
    from specrt.models.config import config_from_hf

    _, qk_norm, write_drafter, drafter = sm.PRESETS[preset]
    cfg = sm.preset_config(preset, layers=layers)
    folder = out / "tokenizer"
    folder.mkdir(parents=True)
    tensors = sm.preset_tensors(cfg, qk_norm)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    sm.write_tokenizer(folder, cfg, preset)

    class Drawn:  # what sources.load returns, as far as main reads it
        hf_config, config, weights = cfg, config_from_hf(cfg), DrawnWeights(tensors, seed)

    main(str(folder), str(out / "target.gguf"), Drawn, quant=quant, seed=seed)
    write_drafter(out / drafter, cfg, np.random.default_rng(seed))
    print(f"{drafter} drafter -> {out / drafter}", file=sys.stderr)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", help="an HF folder (without --preset)")
    ap.add_argument("out", type=Path, help="OUT.gguf, or with --preset a new folder")
    ap.add_argument("--preset", help="a scripts/synthetic_model.py preset, drawn tensor by tensor")
    ap.add_argument("--layers", type=int, help="with --preset: target layers (default: the published count)")
    ap.add_argument("--quant", choices=["q4_0", "q4_k_m"], default="q4_0")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.preset:
        main_preset(a.preset, a.out, a.layers, a.seed, a.quant)
    elif a.folder:
        main(a.folder, str(a.out), quant=a.quant, seed=a.seed)
    else:
        ap.error("give an HF folder or --preset")
