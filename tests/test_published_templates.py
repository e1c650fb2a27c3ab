"""The published chat templates (llama.cpp keeps them under models/templates/, fetched by tests/llamacpp_source.py)
render through specrt exactly as through transformers, and each maps to the tool format that reads what it writes.

specrt's side is what a request becomes: OpenAI's messages (a call's arguments a JSON string, a result by its
tool_call_id, an earlier turn's reasoning as reasoning_content) planned by runtime/tools.py and rendered in
runtime/template_sandbox.py. transformers' side is the conversation as its documentation has a user pass it to
apply_chat_template (arguments an object, gpt-oss's reasoning as `thinking`), rendered by transformers' own compiled
template. The prompts must be equal, character for character."""

from __future__ import annotations

import copy
import json

import pytest

from specrt.runtime.template_sandbox import compile_template, render_cap, render_template
from specrt.runtime.tool_detection import format_of, round_trips
from specrt.runtime.tool_formats import FORMATS
from specrt.runtime.tools import parse_tools, plan
from tests.llamacpp_source import published_template, published_templates

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Météo d'une ville, <en direct> & 'fiable'",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "la ville"}, "days": {"type": "integer"}}}}}]
CALL = {"role": "assistant", "content": "", "reasoning_content": "Il faut la météo de Besançon.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Besançon", "days": 2}, ensure_ascii=False)}}]}
ASK = [{"role": "system", "content": "Tu es utile."}, {"role": "user", "content": "Quel temps à Besançon?"}]
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "ciel": "dégagé"}'}
CONVERSATIONS = {
    "ask": ASK,  # tools, no history
    "result": ASK + [CALL, RESULT],  # a call (with its reasoning) and its result: the model answers next
    "next turn": ASK + [CALL, RESULT, {"role": "assistant", "content": "Il fait 21 degrés.",
                                       "reasoning_content": "Le résultat dit 21."},
                        {"role": "user", "content": "Et demain?"}],
}
# the templates named in issue 49, and the template variables each is asked with
PUBLISHED = {
    "Qwen3.5-4B.jinja": [{}, {"enable_thinking": False}, {"enable_thinking": True}],
    "Qwen3-Coder.jinja": [{}],
    "google-gemma-4-31B-it.jinja": [{}, {"enable_thinking": True}],
    "openai-gpt-oss-120b.jinja": [{}, {"reasoning_effort": "low"}, {"reasoning_effort": "high"}],
    "meta-llama-Llama-3.1-8B-Instruct.jinja": [{}],
    "meta-llama-Llama-3.2-3B-Instruct.jinja": [{}],
    "meta-llama-Llama-3.3-70B-Instruct.jinja": [{}],
    "Qwen-Qwen2.5-7B-Instruct.jinja": [{}],
    "Qwen-Qwen3-0.6B.jinja": [{}, {"enable_thinking": False}],
}
FORMAT = {"Qwen3.5-4B.jinja": "qwen_xml", "Qwen3-Coder.jinja": "qwen_xml", "google-gemma-4-31B-it.jinja": "gemma4",
          "openai-gpt-oss-120b.jinja": "harmony", "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
          "Qwen-Qwen3-0.6B.jinja": "hermes", "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
          "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3", "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3"}
CASES = [(name, conversation, variables) for name, variants in PUBLISHED.items() for conversation in CONVERSATIONS
         for variables in variants]
SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}


def _as_transformers_users_pass_it(messages: list[dict], harmony: bool) -> list[dict]:
    out = []
    for m in copy.deepcopy(messages):
        for c in m.get("tool_calls") or ():
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if harmony and "reasoning_content" in m:
            m["thinking"] = m.pop("reasoning_content")
        out.append(m)
    return out


def _transformers(source: str, messages: list[dict], **variables) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(source).render(messages=messages, tools=TOOLS, add_generation_prompt=True,
                                                 **SPECIAL, **variables)


def _specrt(source: str, messages: list[dict], **variables) -> str:
    p = plan(messages, parse_tools(TOOLS), "auto", None, True, format_of(source), source)
    return render_template(compile_template(source), p.messages, render_cap(p.messages), add_generation_prompt=True,
                           **SPECIAL, **variables, **p.variables)


@pytest.mark.parametrize("name, conversation, variables", CASES,
                         ids=[f"{n}-{c}-{'-'.join(f'{k}={v}' for k, v in v.items()) or 'default'}" for n, c, v in CASES])
def test_published_templates_render_as_transformers_renders_them(name, conversation, variables):
    source = published_template(name)
    assert format_of(source) == FORMAT[name]
    messages = CONVERSATIONS[conversation]
    want = _transformers(source, _as_transformers_users_pass_it(messages, FORMAT[name] == "harmony"), **variables)
    assert _specrt(source, messages, **variables) == want
    if conversation != "ask":  # the call went back as the model writes it, the result after it
        assert "Besançon" in want and "dégagé" in want


def test_each_published_template_maps_to_a_format_that_reads_it_back_or_to_generic():
    """Over llama.cpp's whole template folder: a template whose markers a format has either round-trips (a call it
    renders reads back as that call) or falls back to the generic format; the named ones map to their own."""
    templates = published_templates()
    assert len(templates) >= 60
    mapped = {name: format_of(source) for name, source in templates.items()}
    for name, source in templates.items():
        if mapped[name] != "generic":
            assert round_trips(FORMATS[mapped[name]], source), name
        else:
            assert not any(f.matches(source) and round_trips(f, source) for f in FORMATS.values()), name
    assert {name: mapped[name] for name in FORMAT} == FORMAT
    # templates that share a marker with a format but write calls their own way are not read in it
    for name in ("GLM-4.6.jinja", "MiniMax-M3.jinja", "ByteDance-Seed-OSS.jinja", "unsloth-Apriel-1.5.jinja"):
        assert mapped[name] == "generic", name


PLAIN = [{"role": "system", "content": "Tu es utile."}, {"role": "user", "content": "Bonjour, ça va?"},
         {"role": "assistant", "content": "Très bien."}, {"role": "user", "content": "Et toi?"}]


def _or_refused(render, *args, **kwargs) -> str:
    """The prompt, or "refused" where the template raises (a template that takes no system turn raises in both)."""
    try:
        return render(*args, **kwargs)
    except Exception:  # transformers raises jinja's own errors, specrt its TemplateError: both refuse
        return "refused"


def test_every_published_template_renders_a_plain_chat_as_transformers_does():
    """All of llama.cpp's templates (Mistral, DeepSeek, GLM, SmolLM3, Phi, Granite, Kimi ... not only those with a
    tool format specrt speaks): a conversation with a system turn and an earlier answer, no tools."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    differ = []
    for name, source in published_templates().items():
        want = _or_refused(lambda: _compile_jinja_template(source).render(messages=PLAIN, add_generation_prompt=True,
                                                                           **SPECIAL))
        got = _or_refused(lambda: render_template(compile_template(source), PLAIN, render_cap(PLAIN),
                                                  add_generation_prompt=True, **SPECIAL))
        if got != want:
            differ.append(name)
    assert differ == []


# Gemma 4's first ("interleaved") template takes results inside the calling turn (`tool_responses`), not as tool
# messages: transformers renders OpenAI's tool messages there as turns of a role the model never saw, specrt moves
# them where that template wants them (runtime/tool_formats.py Gemma4.history)
OWN_RESULTS = {"google-gemma-4-31B-it-interleaved.jinja"}


def test_every_template_with_a_tool_format_renders_tools_as_transformers_does():
    """Every template of the folder that maps to a tool format (not only the named ones): the three conversations."""
    differ = []
    for name, source in published_templates().items():
        fmt = format_of(source)
        if fmt == "generic" or name in OWN_RESULTS:
            continue
        for conversation, messages in CONVERSATIONS.items():
            want = _transformers(source, _as_transformers_users_pass_it(messages, fmt == "harmony"))
            if _specrt(source, messages) != want:
                differ.append((name, conversation))
    assert differ == []
