"""A reasoning model's thought through `specrt serve`, as llama-server (reasoning_format auto / deepseek / none) and
vLLM's reasoning parsers give it: `reasoning_content` apart from `content`, whole and streamed alike, with no thought
marker left in the content; `reasoning_format: none` keeps the thought in the content, markers and all (after the
`<think>` the prompt left open). Tiny bundles carry the published templates (tests/llamacpp_source.py); the model's
answer is scripted, the rest (prompt, parser, server) is the real path."""

from __future__ import annotations

import json

import pytest

from tests.llamacpp_source import published_template

CASES = {
    # Qwen3.5 with thinking on: the prompt ends with `<think>\n`, so the answer starts inside the thought
    "Qwen3.5-4B.jinja": ("I'm\nthinking\n</think>\n\nHello, world!", "Hello, world!", "I'm\nthinking\n",
                         "<think>\nI'm\nthinking\n</think>\n\nHello, world!"),
    # Qwen3: the model opens its thought itself
    "Qwen-Qwen3-0.6B.jinja": ("<think>\nI'm\nthinking\n</think>\n\nHello, world!", "Hello, world!",
                              "\nI'm\nthinking\n", "<think>\nI'm\nthinking\n</think>\n\nHello, world!"),
    # Gemma 4: the thought channel, and a stray closer after the answer (llama.cpp's case)
    "google-gemma-4-31B-it.jinja": ("<|channel>thought\nI'm\nthinking<channel|>Hello, world!<channel|>",
                                    "Hello, world!", "I'm\nthinking",
                                    "<|channel>thought\nI'm\nthinking<channel|>Hello, world!<channel|>"),
}


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    from tests.tiny_models import save_tiny_bundle_source

    return save_tiny_bundle_source("llama", tmp_path_factory.mktemp("reasoning") / "src")


def _bundle(source, root, template: str):
    import shutil

    from specrt.cli import main

    src = root / "src"
    shutil.copytree(source, src)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = published_template(template)
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert main(["convert", str(src), "-o", str(root / "bundle"), "--max-context", "64"]) == 0
    return root / "bundle"


@pytest.mark.parametrize("template", list(CASES))
def test_the_server_sends_the_thought_apart_from_the_answer(tiny_source, tmp_path, monkeypatch, template):
    from starlette.testclient import TestClient

    import specrt
    from specrt.app.serve.app import build_app
    from tests.server_process import script_answers

    answer, content, thought, inline = CASES[template]
    engine = specrt.load(str(_bundle(tiny_source, tmp_path, template)), device="cpu")
    script_answers(engine, monkeypatch, answer, 3)  # a trained model's answer, markers split across chunks
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    with TestClient(build_app(engine, "m"), base_url="http://localhost") as client:
        message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": content, "reasoning_content": thought}
        lines = client.post("/v1/chat/completions", json={**body, "stream": True}).text.splitlines()
        deltas = [json.loads(x[6:])["choices"][0]["delta"] for x in lines if x.startswith("data: {")]
        assert "".join(d.get("content", "") for d in deltas) == content
        assert "".join(d.get("reasoning_content", "") for d in deltas) == thought
        kept = client.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
        assert kept["choices"][0]["message"]["content"] == inline
        bad = client.post("/v1/chat/completions", json={**body, "reasoning_format": "hidden"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_format"


def test_an_earlier_thought_goes_back_to_the_template(tiny_source, tmp_path):
    """reasoning_content on an assistant turn reaches the template (Qwen3.5 renders the thought of a turn after the
    last user message), as llama.cpp and vLLM take it back."""
    import specrt
    from specrt.app.serve.requests import parse

    engine = specrt.load(str(_bundle(tiny_source, tmp_path, "Qwen3.5-4B.jinja")), device="cpu")
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."}]}
    job = parse(body, True, "m", engine.max_context)
    text = engine.tokenizer.render(job.prompt, add_generation_prompt=False)
    assert "<think>\nGreet back.\n</think>\n\nHello." in text
