"""The runtime on a tiny bundle: sampling, streaming detokenization, prefix KV reuse, chat, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from specrt.runtime.detokenize import StreamDecoder
from specrt.runtime.engine import EngineBusyError, StopStringFilter
from specrt.runtime.sampling import SamplingError, SamplingParams, target_probs
from specrt.runtime.target_session import ContextOverflowError
from specrt.runtime.tokenizer import PromptError
from tests.tiny_models import save_tiny_bundle_source


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import specrt
    from specrt.cli import main

    src = save_tiny_bundle_source("llama", tmp_path_factory.mktemp("src") / "tiny")
    bundle = tmp_path_factory.mktemp("b") / "bundle"
    assert main(["convert", str(src), "-o", str(bundle), "--max-context", "96"]) == 0
    return specrt.load(str(bundle), device="cpu")


def test_sampling_params_are_validated():
    for bad in (dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(max_new_tokens=0)):
        with pytest.raises(SamplingError):
            SamplingParams(**bad)
    assert issubclass(SamplingError, ValueError)


def test_top_k_top_p_filtering():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    np.testing.assert_allclose(p, [0.625, 0.375, 0, 0])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=3))
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.15, 0]) / 0.95)


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the cat sat on the mat"] * 20, trainer)
    return tok


def test_stream_chunks_concatenate_to_the_full_decode():
    tok = _byte_level_tokenizer()
    text = "héllo 🌍 世界 the cat 😀😀 naïve ünïcödé 你好"
    ids = tok.encode(text).ids
    dec = StreamDecoder(tok)
    chunks = [dec.push(i) for i in ids] + [dec.finish()]
    assert "".join(chunks) == tok.decode(ids) == text
    assert not any("\ufffd" in c for c in chunks)  # never a split character
    assert sum(1 for c in chunks if c) > 5  # and it really streams


def test_stop_string_filter_holds_back_partial_matches():
    f = StopStringFilter(("STOP",))
    outs = [f.feed(c) for c in ["abc S", "TO", "P tail"]]
    assert "".join(o for o, _ in outs) == "abc "
    assert outs[-1][1] is True


def test_greedy_generation_and_result(engine):
    gen = engine.generate("the cat and the dog", SamplingParams(max_new_tokens=8))
    text = "".join(gen)
    res = gen.result
    assert res.text == text
    assert 1 <= len(res.token_ids) <= 8
    assert res.finish_reason in ("stop", "length")
    assert res.stats.new_tokens == len(res.token_ids)
    assert res.stats.mean_accepted == 1.0  # plain decoding: one token per target call, stop token included


def test_seed_reproduces_sampled_text(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7, stop_token_ids=())
    a = engine.generate("the man", params).wait()
    b = engine.generate("the man", params).wait()
    c = engine.generate("the man", SamplingParams(max_new_tokens=12, temperature=1.0, seed=8, stop_token_ids=())).wait()
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_chat_reuses_kv_and_matches_a_fresh_prefill(engine):
    params = SamplingParams(max_new_tokens=6, stop_token_ids=())
    chat = engine.chat()
    chat.send("the world", params).wait()
    second = chat.send("a family", params).wait()
    assert second.stats.reused_tokens > 0  # only the new turn was prefilled
    engine.reset()
    fresh = engine.generate(chat.messages[:-1], params).wait()
    assert fresh.stats.reused_tokens == 0
    assert fresh.token_ids == second.token_ids


def test_bad_prompts(engine):
    with pytest.raises(PromptError):
        engine.generate("   ")
    with pytest.raises(ContextOverflowError, match="context"):
        engine.generate("the " * 200)


def test_second_concurrent_generation_waits_or_refuses(engine):
    first = engine.generate("the cat", SamplingParams(max_new_tokens=30, stop_token_ids=()))
    next(iter(first), None)  # running: holds the engine
    with pytest.raises(EngineBusyError):
        next(engine.generate("the dog", wait=False))
    done = []
    waiter = threading.Thread(target=lambda: done.append(engine.generate("the dog", SamplingParams(max_new_tokens=3)).wait()))
    waiter.start()
    waiter.join(0.3)
    assert not done  # waiting for the first generation
    first.wait()
    waiter.join(10)
    assert done and done[0].stats.new_tokens >= 1


def test_runtime_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, specrt, specrt.app.api, specrt.runtime.engine; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "  "], "empty prompt"),
        (["--prompt", "the cat", "--temperature", "-1"], "temperature"),
        (["--prompt", "the cat", "--top-p", "1.5"], "top_p"),
        (["--prompt", "the cat", "--device", "cuda"], "CUDAExecutionProvider"),
        (["--prompt", "the cat", "--drafter", "dflash"], "has no DFlash drafter"),
        (["--prompt", "the cat", "--drafter", "mtp"], "has no MTP module"),
    ],
)
def test_generate_cli_bad_input(engine, args, message, capsys):
    from specrt.cli import main

    code = main(["generate", str(engine.bundle_dir), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.strip().count("\n") == 0


def test_unknown_model_lists_the_catalog(capsys):
    from specrt.cli import main

    code = main(["generate", "no-such-model", "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "smollm2-135m-instruct" in err
