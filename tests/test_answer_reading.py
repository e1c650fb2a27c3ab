"""Answers read as llama.cpp reads them, where specrt read them otherwise (issue 49's failure list, one test each):
calls from gpt-oss's analysis channel and to its built-in tools, Qwen3-Coder's calls without their opener (read, and
constrained under tool_choice auto), markers inside a Qwen thought (not calls, and no call grammar opened by them),
typed union values, Gemma 4's stray channel markers. Each answer goes through runtime/tools.py with the plan a
request gets from the published template (tests/llamacpp_source.py)."""

from __future__ import annotations

import json

import pytest

from specrt.runtime.tool_detection import format_of
from specrt.runtime.tools import call_grammar, parse_tools, plan, read_answer
from tests.llamacpp_source import published_template
from tests.test_tool_formats import _accepts, _matcher, _vocabulary

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "required": ["a", "b"], "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
UNION = {"type": "function", "function": {"name": "set_value", "description": "Set values", "parameters": {
    "type": "object", "properties": {"nullable": {"type": ["string", "null"]}, "number": {"type": ["string", "integer"]},
                                     "thing": {"type": ["string", "object"]}, "text": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "Add 1 and 2."}]


def _plan(template: str, tools=(ADD,), mode: str = "auto"):
    source = published_template(template)
    return plan(ASK, parse_tools(list(tools)), mode, None, True, format_of(source), source)


def _read(template: str, text: str, open_thought: bool = False, tools=(ADD,)):
    said = read_answer(text, _plan(template, tools), open_thought)
    return said.content, said.reasoning, [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                          for c in said.calls]


GPT_OSS = "openai-gpt-oss-120b.jinja"


def test_gpt_oss_call_from_the_analysis_channel_is_a_call_not_reasoning():
    text = ("<|channel|>analysis<|message|>Need the sum.<|end|><|start|>assistant to=functions.add"
            '<|channel|>analysis<|message|>{"a": 1, "b": 2}<|call|>')
    assert _read(GPT_OSS, text) == ("", "Need the sum.", [("add", {"a": 1, "b": 2})])


@pytest.mark.parametrize("recipient", ["container.exec", "python", "browser.search"])
def test_gpt_oss_messages_to_built_in_tools_are_never_content(recipient):
    text = (f"<|channel|>analysis<|message|>Run it.<|end|><|start|>assistant to={recipient}<|channel|>commentary"
            "<|message|>print('hi')<|call|>")
    assert _read(GPT_OSS, text) == ("", "Run it.", [])


def test_qwen3_coder_call_without_its_opener_is_read():
    text = "Let me add.\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n" \
           "</function>\n</tool_call>"
    assert _read("Qwen3-Coder.jinja", text) == ("Let me add.", "", [("add", {"a": 1, "b": 2})])


def test_qwen3_coder_call_without_its_opener_is_constrained_under_auto(int4_bundle, tmp_path):
    tok, vocabulary = _vocabulary(int4_bundle, tmp_path)
    grammar = call_grammar(_plan("Qwen3-Coder.jinja"), vocabulary.special_id, open_thought=False)
    bare = "Let me add.\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n" \
           "</function>\n</tool_call>"
    assert _accepts(tok, _matcher(vocabulary, grammar), bare)
    matcher = _matcher(vocabulary, grammar)  # once `<function=` is written, only a call of a given tool follows
    assert not all(matcher.consume_token(t) for t in tok.encode("Let me add.\n<function=subtract>",
                                                               add_special_tokens=False).ids)


@pytest.mark.parametrize("template, open_thought, text", [
    # Qwen3.5 with thinking on: the prompt opens the thought
    ("Qwen3.5-4B.jinja", True, "Maybe <tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n"
                               "2\n</parameter>\n</function>\n</tool_call>? No.\n</think>\n\nIt is 3."),
    # Qwen3: the model opens its thought itself
    ("Qwen-Qwen3-0.6B.jinja", False, '<think>\nMaybe <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
                                     "</tool_call>? No.\n</think>\n\nIt is 3."),
])
def test_a_call_inside_a_qwen_thought_is_thought_not_a_call(template, open_thought, text):
    content, thought, calls = _read(template, text, open_thought)
    assert (content, calls) == ("It is 3.", []) and "<tool_call>" in thought


@pytest.mark.parametrize("template, open_thought, text", [
    ("Qwen3.5-4B.jinja", True, "Maybe <tool_call> now? No.\n</think>\n\nIt is 3."),
    ("Qwen-Qwen3-0.6B.jinja", False, "<think>\nMaybe <tool_call> now? No.\n</think>\n\nIt is 3."),
])
def test_a_call_opener_inside_a_qwen_thought_opens_no_call_grammar(int4_bundle, tmp_path, template, open_thought,
                                                                   text):
    """Under tool_choice auto the lazy grammar opens only after the thought: a `<tool_call>` written while thinking
    (here followed by words, no call) is let through."""
    tok, vocabulary = _vocabulary(int4_bundle, tmp_path)
    grammar = call_grammar(_plan(template), vocabulary.special_id, open_thought=open_thought)
    assert _accepts(tok, _matcher(vocabulary, grammar), text)
    matcher = _matcher(vocabulary, grammar)  # after the thought the same words are no call: refused
    assert not all(matcher.consume_token(t) for t in tok.encode(text + "\n<tool_call> now",
                                                               add_special_tokens=False).ids)


def test_qwen_xml_union_values_are_read_typed():
    call = ("<tool_call>\n<function=set_value>\n<parameter=nullable>\nnull\n</parameter>\n<parameter=number>\n42\n"
            "</parameter>\n<parameter=thing>\n{\"a\": 1}\n</parameter>\n<parameter=text>\n42\n</parameter>\n"
            "</function>\n</tool_call>")
    assert _read("Qwen3-Coder.jinja", call, tools=(UNION,))[2] == [
        ("set_value", {"nullable": None, "number": 42, "thing": {"a": 1}, "text": "42"})]
    words = call.replace("\n42\n</parameter>\n<parameter=thing>", "\n2 dollars\n</parameter>\n<parameter=thing>")
    assert _read("Qwen3-Coder.jinja", words, tools=(UNION,))[2][0][1]["number"] == "2 dollars"


@pytest.mark.parametrize("text", [
    "<|channel>thought\n<channel|>Hello.<channel|>",
    "<|channel><|channel>thought\n<channel|>Hello.",
    "<|channel>thought\n<channel|>Hello.<|channel>thought\n<channel|>",
])
def test_gemma_channel_markers_never_reach_the_content(text):
    assert _read("google-gemma-4-31B-it.jinja", text)[:2] == ("Hello.", "")
