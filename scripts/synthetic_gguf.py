"""Write an HF llama-family folder (e.g. scripts/synthetic_model.py's target) as a pure Q4_0 GGUF for llama.cpp,
streaming: one tensor is read, quantized and written at a time.

    python scripts/synthetic_gguf.py FOLDER OUT.gguf

Every matrix becomes Q4_0 (32 weights per block: an fp16 scale and 4-bit values, llama.cpp's own layout), every
norm stays F32; q/k rows are permuted to llama.cpp's interleaved rotary order; the tokenizer's vocabulary goes in
as a BPE ("gpt2") token list. The same random weights as the specrt bundle, at about the same bits per weight
(4.5), so that plain decoding speed compares engine with engine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(folder: str, out: str) -> None:
    import gguf
    from tokenizers import Tokenizer

    sys.path.insert(0, str(ROOT))
    from specrt.convert import sources
    from tests.gguf_writer import gguf_name, llama_cpp_permute

    folder_path = Path(folder)
    loaded = sources.load(sources.resolve(folder))
    hf, cfg = loaded.hf_config, loaded.config
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[cfg.model_type]
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
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)

    tok = Tokenizer.from_file(str(folder_path / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    tokens = [t for t, _ in by_id]
    # llama.cpp needs at least one merge, whose result must be a token: the first placeholder becomes "ĠĠ"
    # (prompts are given to llama.cpp as token ids, so its tokenizer never decides anything here)
    spare = next(i for i, t in enumerate(tokens) if t.startswith("<|placeholder_"))
    tokens[spare] = "\u0120\u0120"
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in by_id])
    writer.add_token_merges(["\u0120 \u0120"])
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_ids[0])

    plan = []  # (gguf name, HF name, numpy shape, type)
    for name in loaded.weights:
        shape = loaded.weights.shape(name)
        qtype = gguf.GGMLQuantizationType.Q4_0 if len(shape) == 2 else gguf.GGMLQuantizationType.F32
        plan.append((gguf_name(name), name, shape, qtype))
    for gname, _, shape, qtype in plan:
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor_info(gname, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
            writer.add_tensor_info(gname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for k, (gname, name, shape, qtype) in enumerate(plan, 1):
        w = np.ascontiguousarray(loaded.weights[name], dtype=np.float32)
        if name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, cfg.num_heads)
        elif name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, cfg.num_kv_heads)
        if qtype != gguf.GGMLQuantizationType.F32:
            w = gguf.quants.quantize(w, qtype)
        writer.write_tensor_data(w)
        if k % 20 == 0 or k == len(plan):
            print(f"{k}/{len(plan)} tensors", file=sys.stderr)
    writer.close()
    print(f"{out}: {Path(out).stat().st_size / 2**30:.2f} GiB", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
