"""The runtime on the real default model: greedy generation equals transformers, seeded sampling repeats,
chat KV reuse equals re-prefilling, streaming keeps emoji and CJK whole, and `specrt chat` in a terminal."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import specrt
from specrt.runtime.sampling import SamplingParams
from tests.conftest import FULL
from tests.lossless import PROMPTS
from tests.test_real_model import transformers_greedy

pytestmark = pytest.mark.real_model

# transformers' eager forward is the slow side (~12 tokens/s): 2 prompts in the default tier, 10 in the full one
REFERENCE_PROMPTS = PROMPTS if FULL else (PROMPTS[0], PROMPTS[9])


@pytest.fixture(scope="module")
def fp32_engine(bundles):
    return specrt.load(str(bundles["fp32"]), device="cpu")


def test_greedy_generate_equals_transformers(fp32_engine, hf_gguf_model):
    stops = set(fp32_engine.manifest.stop_token_ids)
    for prompt in REFERENCE_PROMPTS:
        ids = fp32_engine.prompt_ids(prompt)
        res = fp32_engine.generate(prompt, SamplingParams(max_new_tokens=64)).wait()
        want = transformers_greedy(hf_gguf_model, ids, 64)
        cut = next((i for i, t in enumerate(want) if t in stops), len(want))
        assert res.token_ids == want[:cut], prompt
        assert res.finish_reason == ("stop" if cut < 64 else "length")


def test_generate_cli_json(bundles, fp32_engine):
    proc = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", str(bundles["fp32"]), "--prompt", PROMPTS[0],
                           "--max-new-tokens", "64", "--json", "--device", "cpu"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"text", "token_ids", "finish_reason", "stats"}
    assert set(out["stats"]) == {"new_tokens", "target_calls", "mean_accepted", "acceptance_length",
                                 "drafted_by_position", "accepted_by_position", "tokens_per_second", "drafter"}
    # --drafter auto (the default) on a bundle with an EAGLE-3 head, a DFlash drafter and a draft model: all of them
    # and ngram, mixed; fp32 speculation is exact here, so the tokens equal plain decoding's
    assert "Paris" in out["text"] and out["stats"]["drafter"] == "eagle3+dflash+draft-model+ngram+ngram:pool"
    assert out["stats"]["mean_accepted"] >= 1.0
    assert out["token_ids"] == fp32_engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=64)).wait().token_ids


def test_same_seed_same_sampled_text(fp32_engine):
    params = SamplingParams(max_new_tokens=48, temperature=0.8, top_p=0.95, top_k=50, seed=1234)
    a = fp32_engine.generate(PROMPTS[1], params).wait()
    b = fp32_engine.generate(PROMPTS[1], params).wait()
    assert a.text == b.text and a.token_ids == b.token_ids


def test_multi_turn_kv_reuse_equals_full_reprefill(fp32_engine):
    params = SamplingParams(max_new_tokens=40)
    chat = fp32_engine.chat()
    chat.send("What is the capital of France?", params).wait()
    chat.send("And what is its most famous tower?", params).wait()
    third = chat.send("How tall is it?", params).wait()
    assert third.stats.reused_tokens > 0.5 * third.stats.prompt_tokens
    fp32_engine.reset()
    fresh = fp32_engine.generate(chat.messages[:-1], params).wait()
    assert fresh.stats.reused_tokens == 0
    assert fresh.token_ids == third.token_ids


def test_streaming_keeps_emoji_and_cjk_whole(fp32_engine):
    seen_non_ascii = False
    for prompt in ("Repeat exactly: 你好，世界！🌍🚀 こんにちは 😀", "Write the word 'love' in Chinese characters and add a heart emoji."):
        gen = fp32_engine.generate(prompt, SamplingParams(max_new_tokens=48))
        chunks = list(gen)
        full = fp32_engine.tokenizer.decode(gen.result.token_ids)
        assert "".join(chunks) == gen.result.text == full
        assert not any("\ufffd" in c for c in chunks)
        seen_non_ascii |= any(ord(ch) > 0x2000 for ch in full)
    assert seen_non_ascii  # the prompts really produced multi-byte characters


def test_chat_in_a_pseudo_terminal(bundles):
    import pexpect

    # a long answer budget: at ~150 tok/s a 256-token story can end before Ctrl-C arrives
    child = pexpect.spawn(sys.executable, ["-m", "specrt.cli", "chat", str(bundles["int4"]), "--device", "cpu",
                                           "--max-new-tokens", "1500"], encoding="utf-8", timeout=120)
    child.expect(">>> ")
    child.sendline("What is the capital of France?")
    child.expect(r"\[\d+ tokens, [\d.]+ tok/s")
    answer = child.before
    assert "Paris" in answer
    child.expect(">>> ")
    child.sendline("/stats")
    child.expect("target calls")
    child.expect(">>> ")
    child.sendline("Write a very long story about a dragon who learns to sing.")
    child.expect("sing.\r\n")  # the terminal's echo of the question
    child.expect(r"\w+ \w+ \w+")  # the answer is streaming
    child.sendintr()  # Ctrl-C stops the answer, not the chat
    child.expect(r"\(stopped\)")
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_answers_as_json_and_shows_tool_calls(bundles, tmp_path):
    """/json makes the next answers JSON objects (a schema file: fitting it); --tools shows the model's calls as
    [tool call] lines (--tool-choice required: it must call one)."""
    import json

    import pexpect

    schema = tmp_path / "city.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                  "required": ["city"], "additionalProperties": False}))
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
            "additionalProperties": False}}}]))
    child = pexpect.spawn(sys.executable, ["-m", "specrt.cli", "chat", str(bundles["int4"]), "--device", "cpu",
                                           "--temperature", "0"], encoding="utf-8", timeout=120)
    child.expect(">>> ")
    child.sendline(f"/json {schema}")
    child.expect(r"\(answers as JSON, fitting the schema\)")
    child.expect(">>> ")
    child.sendline("Which city is the capital of France?")
    child.expect(r"\[\d+ tokens")
    answer = child.before.split("France?", 1)[1].strip()
    assert set(json.loads(answer)) == {"city"}
    child.sendline("/json nowhere.json")
    child.expect("error: nowhere.json: not a readable JSON schema")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child = pexpect.spawn(sys.executable, ["-m", "specrt.cli", "chat", str(bundles["int4"]), "--device", "cpu",
                                           "--temperature", "0", "--tools", str(tools), "--tool-choice", "required"],
                          encoding="utf-8", timeout=120)
    child.expect(">>> ")
    child.sendline("What is the weather in Paris?")
    child.expect(r"\[tool call\] get_weather\((\{.*?\})\)")
    assert set(json.loads(child.match.group(1))) == {"city"}
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
