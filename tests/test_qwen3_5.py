"""Qwen3.5 / 3.6 hybrid targets (Gated DeltaNet + gated attention, built-in MTP) on tiny random checkpoints built
from transformers' own classes, in the published multimodal layout and the text-only one: plain decoding equals
transformers, the state of an accepted prefix is replayed exactly, and every drafter speculates losslessly."""

from __future__ import annotations

import re

import numpy as np
import pytest
from safetensors.numpy import save_file

from specrt.cli import main
from specrt.models.config import config_from_hf
from specrt.runtime.drafter import Draft, Drafter
from specrt.runtime.sampling import SamplingParams
from tests.test_mtp import random_mtp_tensors
from tests.tiny_models import (
    GGUF_PROMPT_IDS, assert_greedy_equals_transformers, assert_ids_decode_as_transformers, assert_refused_in_one_line,
    assert_sampled_tokens_follow_the_target, edit_config, hf_model, read_config, save_tiny_bundle_source,
)

PROMPTS = ("the cat and the dog", "a man in the house of the world", "what is the time of day for you")
GREEDY = SamplingParams(max_new_tokens=64, stop_token_ids=())


def add_mtp(src, seed: int = 1):
    """Random MTP weights in the published names (mtp.fc, mtp.layers.0.*, ...), in a shard of their own."""
    tensors = random_mtp_tensors("qwen3_next", config_from_hf(read_config(src)), seed)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(src / "mtp.safetensors"))
    return src


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from tests.test_dflash import random_draft, write_reference_checkpoint

    root = tmp_path_factory.mktemp("qwen3_5")
    out = {arch: add_mtp(save_tiny_bundle_source(arch, root / arch)) for arch in ("qwen3_5", "qwen3_5_text")}
    out["sibling"] = save_tiny_bundle_source("qwen3_5_text", root / "sibling", seed=5)  # same tokenizer
    write_reference_checkpoint(root / "dflash", random_draft(3))  # z-lab's layout, reading target layers 0 and 2
    out["dflash"] = root / "dflash"
    return out


@pytest.fixture(scope="module")
def bundles(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_5_bundles")
    out = {"qwen3_5": root / "multimodal", "qwen3_5_text": root / "text"}
    assert main(["convert", str(sources["qwen3_5"]), "-o", str(out["qwen3_5"]), "--max-context", "128",
                 "--drafter", "mtp"]) == 0
    assert main(["convert", str(sources["qwen3_5_text"]), "-o", str(out["qwen3_5_text"]), "--max-context", "128",
                 "--drafter", "mtp", "--drafter", f"draft-model:{sources['sibling']}",
                 "--drafter", f"dflash:{sources['dflash']}"]) == 0
    return out


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_text"])
def test_plain_greedy_equals_transformers(bundles, arch):
    """64 greedy tokens per prompt, each transformers' own argmax after the same prefix (one full forward of
    transformers' class over prompt + output: its cached generate() rounds its chunked and recurrent kernels
    differently, which flips near-tied tokens of a random model)."""
    import specrt
    from specrt.bundle import load_bundle

    manifest = load_bundle(bundles[arch])
    assert manifest.recurrent and manifest.kv.layer_ids == (3,) and manifest.states.layers == (0, 1, 2)
    engine = specrt.load(str(bundles[arch]), device="cpu")
    model = hf_model(arch)
    assert_greedy_equals_transformers(engine, model, PROMPTS, GREEDY)


class PartlyRightDrafter(Drafter):
    """Proposes plain decoding's next `right` tokens, then wrong ones: every verification keeps a strict prefix
    of its call, so the state of that prefix is replayed from the captured transitions."""

    name = "partly-right"

    def __init__(self, prompt_len: int, greedy: list[int], vocab: int, right: int):
        self.prompt_len, self.greedy, self.vocab, self.right = prompt_len, greedy, vocab, right

    def reset(self, params=None, rng=None) -> None:
        pass

    def propose(self, context, max_tokens):
        truth = self.greedy[len(context) - self.prompt_len:][:max_tokens]
        if not truth:
            return None
        return Draft.chain([t if i < self.right else (t + 1) % self.vocab for i, t in enumerate(truth)])


def test_speculation_over_the_recurrent_state_is_lossless(bundles):
    import specrt
    from specrt.app.api import make_drafter

    bundle = bundles["qwen3_5_text"]
    engine = specrt.load(str(bundle), device="cpu")
    engine.adaptive = False
    names = ("mtp", "ngram", "draft-model", "dflash")
    drafters = {n: make_drafter(n, bundle, engine.manifest, ["CPUExecutionProvider"]) for n in names}
    accepted, drafted = {}, {}
    for prompt in PROMPTS:
        engine.reset()
        plain = engine.generate(prompt, GREEDY, drafter=None).wait().token_ids
        n = len(engine.prompt_ids(prompt))
        runs = [(f"{name}-k{k}", drafters[name], k) for name in names for k in ((1, 2, 3) if name == "mtp" else (3,))]
        runs += [(f"partly-right-{r}", PartlyRightDrafter(n, plain, engine.manifest.vocab_size, r), 4) for r in (0, 2)]
        for label, drafter, k in runs:
            engine.draft_length = k
            engine.reset()
            spec = engine.generate(prompt, GREEDY, drafter=drafter).wait()
            assert spec.token_ids == plain, (label, prompt)
            accepted[label] = accepted.get(label, 0) + sum(spec.stats.accepted_by_position)
            drafted[label] = drafted.get(label, 0) + sum(spec.stats.drafted_by_position)
    assert all(drafted.values()), drafted  # every drafter drafted
    assert accepted["partly-right-2"] > 0 and accepted["partly-right-0"] == 0  # prefixes kept, and none


def test_sampled_mtp_output_follows_the_targets_distribution(bundles):
    """Temperature 0.7, MTP drafting 2 tokens a step, 3000 samples: the first and the second output token (the
    second verified with a draft) each follow the target's own distribution (chi-square on each marginal)."""
    import specrt

    engine = specrt.load(str(bundles["qwen3_5_text"]), device="cpu", drafter="mtp")
    engine.adaptive, engine.draft_length = False, 2
    assert_sampled_tokens_follow_the_target(engine, PROMPTS[0], samples=3000)


def test_chat_turns_reuse_the_prompt_state(bundles):
    """The second turn restores the recurrent state at the first prompt's end (a snapshot: a recurrent state
    cannot be rolled back by a length) and answers as a fresh engine does."""
    import specrt

    engine = specrt.load(str(bundles["qwen3_5_text"]), device="cpu", drafter="mtp")
    params = SamplingParams(max_new_tokens=12, stop_token_ids=())
    chat = engine.chat()
    first = chat.send("the cat and the dog", params).wait()
    second = chat.send("a man in the house", params).wait()
    assert second.stats.reused_tokens >= second.stats.prompt_tokens // 2
    messages = list(chat.messages[:-1])
    fresh = specrt.load(str(bundles["qwen3_5_text"]), device="cpu")
    assert fresh.generate(messages, params, drafter=None).wait().token_ids == second.token_ids
    assert first.token_ids


@pytest.mark.parametrize("kernel", [False, True])
def test_replay_equals_feeding_the_prefix(bundles, kernel):
    """The state after keeping 0..5 of a 6-token call, replayed, equals the state of a call of those tokens, bit for
    bit (ONNX Runtime's GatedDeltaNet steps token by token, and so does the replay): by the numpy twin, and by the
    Triton kernel a GPU's states are replayed with (kernels/state_replay.py, here under its interpreter)."""
    import specrt

    engine = specrt.load(str(bundles["qwen3_5_text"]), device="cpu")
    target, states = engine.target, engine.target.states
    states.kernel_replay = kernel
    tokens = np.array([[5, 17, 30, 2, 44, 8, 61, 9]])
    for kept in range(6):
        target.reset()
        target.forward(tokens[:, :2])
        target.forward(tokens[:, 2:8])
        target.rollback(2 + kept)
        replayed = {i: (states.conv[states.current][i].copy(), states.recurrent[states.current][i].copy())
                    for i in states.layout.layers}
        target.reset()
        target.forward(tokens[:, :2])
        if kept:
            target.forward(tokens[:, 2:2 + kept])
        for i, (conv, rec) in replayed.items():
            np.testing.assert_array_equal(conv, states.conv[states.current][i])
            np.testing.assert_array_equal(rec, states.recurrent[states.current][i])  # bit for bit


def test_tree_drafts_are_refused_in_one_line(bundles):
    import specrt
    from specrt.errors import SpecrtError

    with pytest.raises(SpecrtError, match="one recurrent state along one chain; use mtp"):
        specrt.load(str(bundles["qwen3_5_text"]), device="cpu", drafter="mtp:tree")


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_hybrid_is_validated_and_drafts(sources, tmp_path, precision):
    """int8 / int4 graphs (Gated DeltaNet projections as MatMulNBits too) validated against torch on the same
    quantized weights; in batch-invariant mode greedy MTP speculation equals plain decoding."""
    import specrt
    from specrt.bundle import load_bundle

    out = tmp_path / precision
    assert main(["convert", str(sources["qwen3_5_text"]), "-o", str(out), "--precision", precision,
                 "--max-context", "128", "--drafter", "mtp"]) == 0
    validation = load_bundle(out).provenance["validation"]
    assert validation["quantized_reference"]["max_abs_diff"] < 1e-3
    engine = specrt.load(str(out), device="cpu", drafter="mtp", batch_invariant=True)
    params = SamplingParams(max_new_tokens=32, stop_token_ids=())
    for prompt in PROMPTS[:2]:
        plain = engine.generate(prompt, params, drafter=None).wait()
        assert engine.generate(prompt, params).wait().token_ids == plain.token_ids



@pytest.mark.parametrize("edit, message", [
    (lambda s: edit_config(s, layer_types=["full_attention"] * 4),
     "layer 0 has tensor model.layers.0.linear_attn.in_proj_qkv.weight, but config.json's layer_types says "
     "full_attention"),
    (lambda s: edit_config(s, linear_num_value_heads=3), "linear_num_value_heads 3 is not a multiple"),
    (lambda s: edit_config(s, layer_types=["linear_attention"] * 3), "layer_types must list 4 layers"),
    (lambda s: _drop_tensor(s, "model.language_model.layers.1.linear_attn.A_log"),
     "missing tensor model.layers.1.linear_attn.A_log"),
    (lambda s: _reshape_tensor(s, "model.language_model.layers.2.linear_attn.conv1d.weight"),
     r"tensor model.layers.2.linear_attn.conv1d.weight has shape \(128, 1, 3\), expected \(128, 1, 4\)"),
    (lambda s: _drop_tensor(s, "mtp.fc.weight", "mtp.safetensors", also="mtp.layers.0.mlp.up_proj.weight"),
     "MTP module .* lacks tensor model.mtp.layers.0.mlp.up_proj.weight"),
])
def test_bad_hybrid_sources_are_named(sources, tmp_path, capsys, edit, message):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(sources["qwen3_5"], src)
    edit(src)
    out = tmp_path / "out"
    assert_refused_in_one_line(["convert", str(src), "-o", str(out), "--drafter", "mtp"], out, capsys, message)


def _rewrite(src, shard: str, change):
    from safetensors.numpy import load_file

    tensors = load_file(str(src / shard))
    save_file(change(tensors), str(src / shard))


def _drop_tensor(src, name: str, shard: str = "model.safetensors", also: str | None = None):
    drop = {name} if shard == "model.safetensors" else {also}
    _rewrite(src, shard, lambda t: {k: v for k, v in t.items() if k not in drop})


def _reshape_tensor(src, name: str):
    _rewrite(src, "model.safetensors", lambda t: {**t, name: np.ascontiguousarray(t[name][:, :, :3])})


QWEN35_LIKE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% if enable_thinking is defined and not enable_thinking %}"
    "<think> </think> {% else %}<think> {% endif %}{% endif %}")


def test_thinking_on_and_off_and_the_reasoning_shown_apart(bundles):
    """--think / --no-think set the template's enable_thinking (Qwen3.5's template opens a <think> block for the
    answer, or writes an empty one); the chat shows the reasoning apart from the answer."""
    import specrt
    from specrt.app.chat_cli import ReasoningView
    from specrt.runtime.tokenizer import BundleTokenizer

    engine = specrt.load(str(bundles["qwen3_5_text"]), device="cpu")
    engine.tokenizer = BundleTokenizer(engine.bundle_dir, QWEN35_LIKE_TEMPLATE)
    messages = [{"role": "user", "content": "the cat"}]
    assert engine.reasoning_open(messages)  # the template's default: thinking on
    on = engine.prompt_ids(messages)
    engine.thinking = False
    assert not engine.reasoning_open(messages) and engine.prompt_ids(messages) != on
    assert engine.prompt_ids(messages, thinking=True) == on  # a request's own choice (the server's)
    view = ReasoningView(inside=True, terminal=False)
    shown = "".join(view.feed(c) for c in ["the dog is", " big</th", "ink>the answer"]) + view.finish()
    assert shown == "[thinking]\nthe dog is big\n[answer]\nthe answer"
    view = ReasoningView(inside=False, terminal=True)
    shown = "".join(view.feed(c) for c in ["<thi", "nk>hmm</think>", "ok <b>"]) + view.finish()
    assert shown == "\x1b[2mhmm\x1b[0m\nok <b>"


def test_server_takes_enable_thinking_and_refuses_other_template_variables():
    from specrt.app.serve.requests import RequestError, parse

    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse({**body, "chat_template_kwargs": {"enable_thinking": False}}, True, "m", 64).thinking is False
    assert parse(body, True, "m", 64).thinking is None
    for bad in ({"enable_thinking": "no"}, {"tools": []}, "x"):
        with pytest.raises(RequestError, match="chat_template_kwargs"):
            parse({**body, "chat_template_kwargs": bad}, True, "m", 64)


def _write_gguf(path, edit_metadata=None, mtp: bool = True):
    """The tiny text model (+ MTP) as a qwen35 GGUF in llama.cpp's layout (archs/qwen3_5_gguf.py, checked against
    llama.cpp's own converter's output); edit_metadata(hf) changes the config the metadata is written from."""
    from tests.gguf_writer import write_qwen35_gguf
    from tests.tiny_models import WORDS

    model = hf_model("qwen3_5_text")
    hf = model.config.to_dict()
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if mtp:
        weights.update(random_mtp_tensors("qwen3_next", config_from_hf(hf), 1))
    written = dict(hf)
    if edit_metadata:
        edit_metadata(written)
    write_qwen35_gguf(path, written, weights, ["<|endoftext|>"] + list(WORDS[1:97]), eos=4, mtp_layers=int(mtp),
                      names_from=hf)
    return model, weights


def test_gguf_in_llama_cpps_qwen35_layout_converts_and_drafts_with_its_mtp_block(tmp_path):
    """Names, -exp(A_log), 1 + w norms, tiled value heads and the MTP block (nextn) undone exactly; the bundle
    decodes as transformers does and its MTP module (read from the GGUF's last block) drafts losslessly."""
    from specrt.models.gguf_loader import load_gguf

    model, weights = _write_gguf(tmp_path / "m.gguf")
    hf, loaded, _ = load_gguf(tmp_path / "m.gguf")
    assert hf["layer_types"] == list(model.config.layer_types) and hf["linear_num_value_heads"] == 4
    for name, w in weights.items():
        np.testing.assert_allclose(loaded["model." + name if name.startswith("mtp.") else name], w, rtol=1e-5,
                                   atol=1e-6)
    assert_gguf_converts_and_mtp_drafts(tmp_path / "m.gguf", tmp_path / "bundle", model)


def assert_gguf_converts_and_mtp_drafts(gguf, out, model) -> None:
    """The GGUF converts with its MTP module; plain greedy decoding equals transformers' model's argmax, token by
    token, and greedy speculation with the MTP module (fixed length) equals plain decoding, drafting."""
    import specrt

    assert main(["convert", str(gguf), "-o", str(out), "--max-context", "128", "--drafter", "mtp"]) == 0
    engine = specrt.load(str(out), device="cpu", drafter="mtp")
    engine.adaptive = False
    plain = assert_ids_decode_as_transformers(engine, model)
    engine.reset()
    spec = engine.generate("", SamplingParams(max_new_tokens=32, stop_token_ids=()), ids=GGUF_PROMPT_IDS).wait()
    assert spec.token_ids == plain and sum(spec.stats.drafted_by_position) > 0


@pytest.mark.parametrize("edit, message", [
    (lambda hf: hf.update(linear_num_key_heads=1), "tensor model.layers.0.linear_attn.in_proj_qkv.weight has shape"),
    (lambda hf: hf.update(num_hidden_layers=5, layer_types=hf["layer_types"] + ["full_attention"]),
     "block_count = 6, but the file holds tensors for 5 blocks"),
    (lambda hf: hf.update(layer_types=["linear_attention"] * 4),
     "layer 3 has tensor model.layers.3.self_attn.q_proj.weight, but its qwen35.attention.recurrent_layers says "
     "linear_attention"),
])
def test_inconsistent_qwen35_gguf_metadata_is_named(tmp_path, capsys, edit, message):
    _write_gguf(tmp_path / "m.gguf", edit)
    out = tmp_path / "out"
    assert_refused_in_one_line(["convert", str(tmp_path / "m.gguf"), "-o", str(out)], out, capsys,
                               re.escape(message))


def test_replay_follows_the_recurrence_and_snapshots_expire():
    """kernels/state_replay.replay_recurrent against S *= decay; S += key (x) delta token by token
    (GatedDeltaNetStateReplay's definition), grouped value heads included; a snapshot past a rollback is dropped
    (its tokens are being replaced)."""
    from specrt.bundle import RecurrentStates
    from specrt.kernels.state_replay import replay_recurrent, split_capture
    from specrt.runtime.recurrent_state import StateBuffers

    st = RecurrentStates(layers=(0,), conv_kernel=4, conv_channels=8, value_heads=4, value_dim=3, key_heads=2,
                         key_dim=5)
    rng = np.random.default_rng(0)
    before = rng.standard_normal((1, 4, 3, 5)).astype(np.float32)
    capture = rng.standard_normal((1, st.capacity * (4 + 2 * 5 + 4 * 3))).astype(np.float32)
    capture[0, :st.capacity * 4] = rng.uniform(0.5, 1.0, st.capacity * 4)  # decays in (0, 1]
    decay, key, delta = split_capture(capture[0], st.capacity, 4, 2, 5, 3)
    for kept in range(st.capacity + 1):
        want = before[0].astype(np.float64)
        for t in range(kept):
            want = want * decay[t][:, None, None] + delta[t][:, :, None] * key[t][np.arange(4) // 2][:, None, :]
        got = np.empty_like(before)
        replay_recurrent(before, capture, kept, st.capacity, st.key_heads, got)
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    buffers = StateBuffers(st, 1, np.float32)
    buffers.take_snapshot(5)
    assert buffers.reachable(7, now=9) == 5
    buffers.restore(5, now=9)
    assert buffers.reachable(7, now=5) == 5
    buffers.restore(0, now=5)
    assert buffers.reachable(7, now=0) == 0 and buffers.snapshot_length is None
