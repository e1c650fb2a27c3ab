"""Tiny random-weight HF models built from transformers config classes (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
# Qwen3.5 hybrids: 3 Gated DeltaNet layers + 1 gated attention layer; head_dim 64 so that the partial rotary size
# (16) is what GroupQueryAttention takes; the published multimodal layout ("qwen3_5") and the text-only one
QWEN3_5_TEXT = dict(COMMON, num_hidden_layers=4, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=False)
HYBRID_ARCHS = ("qwen3_5_text", "qwen3_5")
QWEN3_5_MOE_TEXT = dict({k: v for k, v in QWEN3_5_TEXT.items() if k != "intermediate_size"}, num_experts=8,
                        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
# Qwen3-MoE: 8 experts of width 32, 2 routed a token; layer 1 keeps a dense MLP (mlp_only_layers), as a checkpoint
# may; the published Qwen3-30B-A3B divides the top-k weights by their sum (norm_topk_prob), transformers' default not
QWEN3_MOE = dict(COMMON, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[1],
                 norm_topk_prob=True, tie_word_embeddings=False)
# Gemma 4: sliding layers (head size 16, 2 KV heads, window 4) and full layers (head size 32, 1 KV head whose keys
# are its values, proportional rope); E2B's per-layer inputs (16 wide, 6 x 16 = 3 quantization blocks) and its last
# two layers reading layers 2 and 3's caches with double-wide MLPs (the last cached layer full and the one before
# sliding, as in E2B/E4B and as llama.cpp assumes); the MoE variant (26B-A4B's layout) keeps a dense MLP beside 8
# experts of width 32, 2 a token, in every layer
GEMMA4_TEXT = dict(COMMON, num_hidden_layers=6, global_head_dim=32, num_global_key_value_heads=1,
                   attention_k_eq_v=True, hidden_size_per_layer_input=16, vocab_size_per_layer_input=97,
                   num_kv_shared_layers=2, use_double_wide_mlp=True, sliding_window=4, final_logit_softcapping=30.0,
                   layer_types=["sliding_attention", "full_attention"] * 3)
GEMMA4_MOE = dict(COMMON, num_hidden_layers=4, global_head_dim=32, num_global_key_value_heads=1,
                  attention_k_eq_v=True, hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=8,
                  top_k_experts=2, moe_intermediate_size=32, sliding_window=4, final_logit_softcapping=30.0,
                  layer_types=["sliding_attention", "full_attention"] * 2)
# Gemma 4's assistant for GEMMA4_TEXT: 2 query-only layers (sliding, full) of the target's head sizes, hidden 32,
# reading the target's layers 2 and 3; "ordered" drafts over 8 of 97 one-token centroids (E2B/E4B's head form)
GEMMA4_ASSISTANT_TEXT = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                             num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=0,
                             vocab_size_per_layer_input=0, sliding_window=4, model_type="gemma4_text",
                             layer_types=["sliding_attention", "full_attention"])


def hf_assistant(ordered: bool = False, seed: int = 3, **changes):
    """A tiny Gemma4AssistantForCausalLM for GEMMA4_TEXT with random weights (norms, layer scalars and the token
    ordering perturbed away from their defaults)."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.Gemma4AssistantConfig(text_config=dict(GEMMA4_ASSISTANT_TEXT), backbone_hidden_size=64,
                                   use_ordered_embeddings=ordered, num_centroids=97, centroid_intermediate_top_k=8,
                                   **changes)
    model = tf.Gemma4AssistantForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
            if name.endswith("token_ordering"):
                b.copy_(torch.randperm(b.numel()))
    return model


def hf_config(arch: str):
    import transformers as tf

    if arch == "llama":
        return tf.LlamaConfig(**COMMON, tie_word_embeddings=False, rope_theta=10000.0)
    if arch == "llama_wide_heads":  # Gemma 4's head sizes (256, 512) on a tiny model: tests/test_exact_attention.py
        return tf.LlamaConfig(**dict(COMMON, num_hidden_layers=2, num_key_value_heads=1, head_dim=256),
                              tie_word_embeddings=False, rope_theta=10000.0)
    if arch == "llama_wider_heads":
        return tf.LlamaConfig(**dict(COMMON, num_hidden_layers=2, num_key_value_heads=1, head_dim=512),
                              tie_word_embeddings=False, rope_theta=10000.0)
    if arch == "qwen2":
        return tf.Qwen2Config(**COMMON, tie_word_embeddings=True, rope_theta=100000.0)
    if arch == "qwen3":
        return tf.Qwen3Config(**COMMON, tie_word_embeddings=False)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**QWEN3_MOE)
    if arch == "qwen3_moe_sparse":  # every layer a mixture of experts, as llama.cpp's qwen3moe requires
        return tf.Qwen3MoeConfig(**dict(QWEN3_MOE, mlp_only_layers=[]))
    if arch == "qwen3_moe_top8":  # 32 experts, 8 routed a token as in Qwen3-30B-A3B (exact calls: test_moe_exact_calls)
        return tf.Qwen3MoeConfig(**dict(QWEN3_MOE, num_experts=32, num_experts_per_tok=8, moe_intermediate_size=64,
                                        mlp_only_layers=[]))
    if arch == "qwen3_moe_unnormalized":  # softmax weights of the top k used as they are
        return tf.Qwen3MoeConfig(**dict(QWEN3_MOE, norm_topk_prob=False, mlp_only_layers=[]))
    if arch == "gpt_oss":  # 8 experts of width 64, 2 a token; sliding (4) and full layers; yarn rope; sinks
        return tf.GptOssConfig(**dict(COMMON, intermediate_size=64, num_hidden_layers=4), num_local_experts=8,
                               num_experts_per_tok=2, sliding_window=4, tie_word_embeddings=False)
    if arch == "qwen3_5_text":
        return tf.Qwen3_5TextConfig(**QWEN3_5_TEXT)
    if arch == "qwen3_5_text_heads32":  # value heads of 32 columns: whole quantization blocks (test_gguf_exact)
        return tf.Qwen3_5TextConfig(**dict(QWEN3_5_TEXT, linear_value_head_dim=32))
    if arch == "qwen3_5_moe_text":
        return tf.Qwen3_5MoeTextConfig(**QWEN3_5_MOE_TEXT)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
    if arch == "qwen3_5":
        return tf.Qwen3_5Config(text_config=dict(QWEN3_5_TEXT), vision_config=vision, tie_word_embeddings=False)
    if arch == "qwen3_5_moe":
        return tf.Qwen3_5MoeConfig(text_config=dict(QWEN3_5_MOE_TEXT), vision_config=vision, tie_word_embeddings=False)
    if arch == "gemma4_text":
        return tf.Gemma4TextConfig(**GEMMA4_TEXT)
    if arch == "gemma4_moe":
        return tf.Gemma4TextConfig(**GEMMA4_MOE)
    if arch == "gemma4":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=16, patch_size=4)
        return tf.Gemma4Config(text_config=dict(GEMMA4_TEXT), vision_config=vision, audio_config=None)
    if arch == "smollm3":  # layer 3 without rotary (every 4th: no_rope_layers [1, 1, 1, 0])
        return tf.SmolLM3Config(**dict(COMMON, num_hidden_layers=4), tie_word_embeddings=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch in ("phi3", "phi3_long"):  # Phi-4-mini's shape in small: 48 of 64 channels turned, LongRoPE factors
        original = 128 if arch == "phi3" else 16  # phi3: bundles of 96 positions use the short factors, else long
        return tf.Phi3Config(**dict(COMMON, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64),
                             original_max_position_embeddings=original, partial_rotary_factor=0.75,
                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                              "short_factor": [1.0 + 0.05 * i for i in range(24)],
                                              "long_factor": [1.5 + 0.4 * i for i in range(24)]})
    if arch == "lfm2":  # conv, attention, conv, attention; conv kernel 3; MLP width 2/3 x 96 = 64 (a multiple of 32)
        return tf.Lfm2Config(**{k: v for k, v in COMMON.items() if k not in ("head_dim", "rms_norm_eps", "num_hidden_layers")},
                             layer_types=["conv", "full_attention", "conv", "full_attention"], num_hidden_layers=4,
                             block_multiple_of=32, norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gemma3":
        c = dict(COMMON, num_hidden_layers=4)
        return tf.Gemma3TextConfig(
            **c,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
        )
    raise KeyError(arch)


def hf_model(arch: str, seed: int = 0):
    """A tiny HF causal LM with random weights, norms perturbed away from their defaults."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = hf_config(arch)
    if arch == "qwen3_5":  # the published class: language model under model.language_model, a vision tower
        model = tf.Qwen3_5ForConditionalGeneration(cfg).eval()
    elif arch == "qwen3_5_moe":
        model = tf.Qwen3_5MoeForConditionalGeneration(cfg).eval()
    elif arch == "gemma4":
        model = tf.Gemma4ForConditionalGeneration(cfg).eval()
    else:
        model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias") or name.endswith(("router.scale", "per_expert_scale")):
                p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4's learned scalar after each layer (1 when initialized)
                b.uniform_(0.5, 1.5)
    return model


def save_hf_folder(arch: str, path: Path, seed: int = 0) -> Path:
    """Write a tiny model as an HF folder (config.json + model.safetensors), no tokenizer."""
    model = hf_model(arch, seed)
    model.save_pretrained(path, safe_serialization=True)
    return path


def read_config(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def edit_config(src: Path, **changes) -> None:
    """Change keys of a source folder's config.json (of its text_config, in a multimodal layout)."""
    hf = read_config(src)
    hf.get("text_config", hf).update(changes)
    (Path(src) / "config.json").write_text(json.dumps(hf))


WORDS = (
    "<unk> <s> </s> <|im_start|> <|im_end|> the a an of to in and is was it for on with as at by this that "
    "from or be are not have has had but what all were when we there can one so out up if about who get which "
    "go me he she they you i my your his her our their time year people way day man thing woman life child "
    "world school state family student group country problem hand part place case week company system "
    "program question work government number night point home water room mother area money story fact month "
    "lot right study book eye job word business issue side kind head house service friend father power hour "
    "game line end member law car city name"
).split()


def save_tiny_tokenizer(path: Path, vocab_size: int = 97) -> None:
    """A word-level tokenizer.json over the first vocab_size words, with a ChatML chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS[:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    for special in ("<s>", "</s>", "<|im_start|>", "<|im_end|>"):
        tok.add_special_tokens([special])
    tok.save(str(Path(path) / "tokenizer.json"))
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
    )
    cfg = {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>", "chat_template": template}
    (Path(path) / "tokenizer_config.json").write_text(json.dumps(cfg))


def save_tiny_bundle_source(arch: str, path: Path, seed: int = 0) -> Path:
    """An HF folder a user could convert: config.json, model.safetensors, tokenizer."""
    save_hf_folder(arch, path, seed)
    save_tiny_tokenizer(path)
    return path


def convert_tiny(arch: str, root: Path, name: str, *args: str) -> Path:
    """A tiny `arch` saved as a source under root (once) and converted by the CLI to root / name at int4 with `args`
    (--max-context 96 and whatever else is given, e.g. --device cuda); returns the bundle folder."""
    from specrt.cli import main

    src = Path(root) / f"{arch}-src"
    if not (src / "config.json").is_file():
        save_tiny_bundle_source(arch, src)
    out = Path(root) / name
    assert main(["convert", str(src), "-o", str(out), "--precision", "int4", "--max-context", "96", *args]) == 0
    return out


def convert_tiny_llama(root: Path, name: str, seed: int, *args: str) -> Path:
    """A tiny llama saved as a source under root and converted by the CLI to root / name with `args`
    (--max-context 96 and whatever else is given); asserts the conversion succeeded."""
    from specrt.cli import main

    src = save_tiny_bundle_source("llama", Path(root) / f"{name}-src", seed=seed)
    out = Path(root) / name
    assert main(["convert", str(src), "-o", str(out), "--max-context", "96", *args]) == 0
    return out


def assert_greedy_equals_transformers(engine, model, prompts, params) -> None:
    """Each prompt's greedy output (params.max_new_tokens of them, from a reset cache) is transformers' own argmax
    after the same prefix, token by token (one full forward of its class over prompt + output)."""
    for prompt in prompts:
        ids = engine.prompt_ids(prompt)
        engine.reset()
        out = engine.generate(prompt, params, drafter=None).wait().token_ids
        assert len(out) == params.max_new_tokens
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1:-1]
        assert logits.argmax(-1).tolist() == out, prompt


GGUF_PROMPT_IDS = [5, 9, 30, 41, 7, 60]  # a prompt as token ids, for bundles converted from test GGUFs


def assert_ids_decode_as_transformers(engine, model, ids=GGUF_PROMPT_IDS, max_new_tokens: int = 32) -> list[int]:
    """The engine's plain greedy output after prompt token ids (from a reset cache) is transformers' own argmax,
    token by token (one full forward of its class over prompt + output); returns that output."""
    from specrt.runtime.sampling import SamplingParams

    engine.reset()
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=())
    out = engine.generate("", params, ids=list(ids), drafter=None).wait().token_ids
    with torch.no_grad():
        logits = model(torch.tensor([list(ids) + out])).logits[0, len(ids) - 1:-1]
    assert logits.argmax(-1).tolist() == out
    return out


def assert_refused_in_one_line(argv: list[str], out: Path, capsys, message: str) -> None:
    """`specrt ARGV` exits 2 with exactly one error line, which matches the regex `message`, and leaves nothing at
    `out` (no half-written bundle beside it either)."""
    import re

    from specrt.cli import main

    code = main(argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert code == 2 and len(errors) == 1, errors
    assert re.search(message, errors[0]), errors[0]
    assert not out.exists() and not list(Path(out).parent.glob(f".{Path(out).name}.partial-*"))


def assert_sampled_tokens_follow_the_target(engine, prompt: str, samples: int, temperature: float = 0.7) -> None:
    """Sampling at `temperature` with the engine's drafter (the caller sets its draft length), `samples` seeds: the
    first and the second output token (the second verified with a draft) each follow the target's own distribution
    (chi-square on each marginal, p > 0.01), and the drafter drafted."""
    import numpy as np

    from specrt.runtime.sampling import SamplingParams, target_probs
    from tests.test_verify import _chi_square_p

    params = SamplingParams(temperature=temperature, max_new_tokens=2, stop_token_ids=())
    ids = engine.prompt_ids(prompt)
    target, v = engine.target, engine.manifest.vocab_size
    engine.reset()

    def last_logits(tokens):  # graphs with hidden-state taps output them after the logits
        out = target.forward(np.array([tokens]))
        return (out[0] if isinstance(out, tuple) else out)[0, -1].astype(np.float64)

    first = last_logits(ids)
    base = target.length
    rows = []
    for x in range(v):  # the target's logits after each possible first token
        target.rollback(target.reachable(base))  # a recurrent target may only reach an earlier length: replay
        if target.length < base:
            last_logits(ids[target.length:])
        rows.append(last_logits([x]))
    engine.reset()
    p1 = target_probs(first, params)
    p2 = (p1[:, None] * np.stack([target_probs(r, params) for r in rows])).sum(0)
    counts = np.zeros((2, v))
    drafted = 0
    for seed in range(samples):
        out = engine.generate(prompt, SamplingParams(temperature=temperature, max_new_tokens=3, stop_token_ids=(),
                                                     seed=seed)).wait()
        counts[0, out.token_ids[0]] += 1
        counts[1, out.token_ids[1]] += 1
        drafted += sum(out.stats.drafted_by_position)
    assert drafted > 0
    assert _chi_square_p(counts[0], p1) > 0.01
    assert _chi_square_p(counts[1], p2) > 0.01
