"""gpt-oss's harmony format: an answer's channels told apart as it streams (reasoning, answer, tool calls), in the
chat view, in the conversation kept for the next turn, and with the markers kept by the engine's decoder."""

from __future__ import annotations

import json

import pytest

from specrt.runtime.harmony import HarmonyParser, Piece, split

ANSWER = ("<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>")
TOOL = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|>')


def _by_channel(pieces: list[Piece]) -> dict:
    out = {}
    for p in pieces:
        key = (p.channel, p.recipient)
        out[key] = out.get(key, "") + p.text
    return out


def test_a_whole_answer_splits_into_reasoning_and_answer():
    assert split(ANSWER) == ("The user greets; answer briefly.", "Hello! How can I help?")
    parser = HarmonyParser()
    pieces = parser.feed(TOOL) + parser.finish()
    assert _by_channel(pieces) == {("analysis", None): "Need the weather.",
                                   ("commentary", "functions.get_weather"): '{"city": "Paris"}'}
    assert not any(m in p.text for p in pieces for m in ("<|", "|>", "assistant", "json"))
    # the recipient may come before the channel in the header
    early = HarmonyParser()
    pieces = early.feed("<|channel|>final<|message|>ok<|end|><|start|>assistant to=functions.f<|channel|>commentary "
                        "json<|message|>{}<|call|>")
    assert [(p.channel, p.recipient, p.text) for p in pieces] == [("final", None, "ok"), ("commentary", "functions.f", "{}")]


@pytest.mark.parametrize("text", [ANSWER, TOOL])
def test_any_chunking_gives_the_same_pieces(text):
    """Streamed text arrives in arbitrary chunks (a marker may be cut anywhere): every two-cut split of the text
    gives what the whole gives."""
    whole = _by_channel(HarmonyParser().feed(text))
    for i in range(0, len(text), 3):
        for j in range(i, len(text), 7):
            parser = HarmonyParser()
            pieces = parser.feed(text[:i]) + parser.feed(text[i:j]) + parser.feed(text[j:]) + parser.finish()
            assert _by_channel(pieces) == whole, (i, j)


def test_a_possible_marker_is_held_back_until_the_next_chunk():
    parser = HarmonyParser()
    parser.feed("<|channel|>final<|message|>")
    assert [p.text for p in parser.feed("less <|")] == ["less "]  # "<|" may open a marker
    assert [p.text for p in parser.feed("b|> more")] == ["<|b|> more"]  # it did not
    assert [p.text for p in parser.feed("x<|end")] == ["x"]
    assert parser.feed("|>") == [] and parser.state == "between"
    cut = HarmonyParser()
    assert cut.feed("<|channel|>final<|message|>ends in <|ret") and [p.text for p in cut.finish()] == ["<|ret"]


def test_chat_view_shows_thinking_apart_and_calls_by_name():
    from specrt.app.chat_cli import HarmonyView

    view = HarmonyView(HarmonyParser(), terminal=False)
    shown = "".join(view.feed(ANSWER[i:i + 5]) for i in range(0, len(ANSWER), 5)) + view.finish()
    assert shown == "[thinking]\nThe user greets; answer briefly.\n[answer]\nHello! How can I help?"
    view = HarmonyView(HarmonyParser(), terminal=True)
    shown = view.feed(TOOL) + view.finish()
    assert shown == ("\x1b[2mNeed the weather.\x1b[0m\n[call functions.get_weather]\n"
                     '{"city": "Paris"}')


def test_the_conversation_keeps_the_answer_not_the_reasoning():
    from types import SimpleNamespace

    from specrt.runtime.chat import ChatSession
    from specrt.runtime.generation import Generation, GenerationResult

    class FakeEngine:
        tokenizer = SimpleNamespace(harmony=True)

        def generate(self, messages, params):
            gen = Generation(iter(()))

            def chunks():
                yield from (ANSWER[:30], ANSWER[30:])
                gen.result = GenerationResult(ANSWER, [], "stop", None)

            gen._chunks = chunks()
            return gen

    session = ChatSession(FakeEngine())
    assert "".join(session.send("hi")) == ANSWER
    assert session.messages == [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "Hello! How can I help?"}]


@pytest.fixture(scope="module")
def harmony_bundle(tmp_path_factory):
    """A tiny bundle whose tokenizer has the harmony markers and whose template ends in the assistant's header."""
    from tokenizers import Tokenizer

    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source, save_tiny_tokenizer

    root = tmp_path_factory.mktemp("harmony")
    src = save_tiny_bundle_source("llama", root / "src")
    save_tiny_tokenizer(src, vocab_size=88)  # room for the markers below the model's 97 rows
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_special_tokens(["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"])
    tok.add_tokens(["analysis", "final"])
    tok.save(str(src / "tokenizer.json"))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
                            "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}")
    cfg["eos_token"] = "<|return|>"
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    out = root / "bundle"
    assert main(["convert", str(src), "-o", str(out), "--max-context", "64"]) == 0
    return out


def test_the_engine_keeps_harmony_markers_where_the_vocabulary_has_them(harmony_bundle, monkeypatch):
    """Its markers survive decoding (other bundles skip special tokens), and the chat's parser starts inside the
    assistant's header, where the rendered prompt leaves off."""
    import specrt
    import specrt.runtime.engine as engine_module
    from specrt.runtime.detokenize import StreamDecoder
    from specrt.runtime.sampling import SamplingParams

    engine = specrt.load(str(harmony_bundle), device="cpu")
    assert engine.tokenizer.harmony
    vocab = engine.tokenizer.tok.get_vocab(with_added_tokens=True)
    # an answer stops at <|return|>; <|end|> only ends its analysis message (other chat models stop at <|end|>)
    assert vocab["<|return|>"] in engine.stop_ids and vocab["<|end|>"] not in engine.stop_ids
    ids = engine.tokenizer.encode("<|channel|> analysis <|message|> the world <|end|>")
    decoder = StreamDecoder(engine.tokenizer.tok, skip_special_tokens=not engine.tokenizer.harmony)
    text = "".join(decoder.push(i) for i in ids) + decoder.finish()
    parser = engine.harmony_parser([{"role": "user", "content": "the dog"}])
    assert parser.state == "header"
    from specrt.runtime.tokenizer import BundleTokenizer

    plain_template = engine.tokenizer
    engine.tokenizer = BundleTokenizer(harmony_bundle, "{{ messages[0]['content'] }}")  # opens no message
    assert engine.harmony_parser([{"role": "user", "content": "the dog"}]).state == "header"
    engine.tokenizer = plain_template
    assert [(p.channel, p.text.strip()) for p in parser.feed(text)] == [("analysis", "the world")]
    made = []  # the engine's own stream decodes with the markers kept

    class Recording(StreamDecoder):
        def __init__(self, tokenizer, skip_special_tokens=True):
            made.append(skip_special_tokens)
            super().__init__(tokenizer, skip_special_tokens)

    monkeypatch.setattr(engine_module, "StreamDecoder", Recording)
    engine.generate("the cat", SamplingParams(max_new_tokens=4, stop_token_ids=()), raw=True).wait()
    assert made == [False]


def test_the_server_sends_reasoning_apart_from_the_answer(harmony_bundle, monkeypatch):
    """OpenAI chat completions on a harmony bundle, as vLLM's gpt-oss reasoning parser answers: message.content is
    the final channel, message.reasoning_content the analysis; streamed deltas carry the same split."""
    from starlette.testclient import TestClient

    import specrt
    from specrt.app.serve.app import build_app
    from tests.server_process import script_answers

    engine = specrt.load(str(harmony_bundle), device="cpu")
    script_answers(engine, monkeypatch, ANSWER, 9)  # the real call's statistics, the answer of a trained gpt-oss
    body = {"model": "m", "messages": [{"role": "user", "content": "the dog"}], "max_tokens": 4}
    with TestClient(build_app(engine, "m"), base_url="http://localhost") as client:
        message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": "Hello! How can I help?",
                           "reasoning_content": "The user greets; answer briefly."}
        lines = client.post("/v1/chat/completions", json={**body, "stream": True}).text.splitlines()
        deltas = [json.loads(x[6:])["choices"][0]["delta"] for x in lines if x.startswith("data: {")]
        assert "".join(d.get("content", "") for d in deltas) == message["content"]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
        raw = client.post("/v1/completions", json={"model": "m", "prompt": "the dog", "max_tokens": 4}).json()
        assert raw["choices"][0]["text"] == ANSWER  # completions are raw text: the markers stay


def test_reasoning_effort_reaches_the_template(harmony_bundle):
    """gpt-oss's template takes reasoning_effort ("Reasoning: low"): set on the engine (specrt.load, --reasoning-effort)
    or per request (the server's OpenAI parameter), refused in one line when not low / medium / high."""
    import specrt
    from specrt.app.serve.requests import RequestError, parse
    from specrt.errors import SpecrtError
    from specrt.runtime.tokenizer import BundleTokenizer

    engine = specrt.load(str(harmony_bundle), device="cpu", reasoning_effort="low")
    engine.tokenizer = BundleTokenizer(harmony_bundle, "<|start|>system<|message|>Reasoning: "
                                       "{{ reasoning_effort | default('medium') }}<|end|>{% for m in messages %}"
                                       "<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}")
    rendered = []
    render = engine.tokenizer.render
    engine.tokenizer.render = lambda *a, **kw: rendered.append(render(*a, **kw)) or rendered[-1]
    engine.prompt_ids("the dog")
    engine.prompt_ids("the dog", reasoning_effort="high")
    engine.reasoning_effort = None
    engine.prompt_ids("the dog")
    assert [r.split("<|end|>")[0] for r in rendered] == [
        "<|start|>system<|message|>Reasoning: low", "<|start|>system<|message|>Reasoning: high",
        "<|start|>system<|message|>Reasoning: medium"]
    with pytest.raises(SpecrtError, match="reasoning_effort must be one of low, medium, high"):
        specrt.load(str(harmony_bundle), device="cpu", reasoning_effort="max")
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse({**body, "reasoning_effort": "high"}, True, "m", 64).reasoning_effort == "high"
    with pytest.raises(RequestError, match="reasoning_effort"):
        parse({**body, "reasoning_effort": "extreme"}, True, "m", 64)
