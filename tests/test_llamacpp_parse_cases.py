"""Model answers read as llama.cpp reads them: llama.cpp's own chat-parser cases (tests/test-chat.cpp, MIT, The ggml
authors; read by tests/llamacpp_chat_cases.py) for each published template whose tool format specrt speaks, fed to
specrt's reader (runtime/tools.py read_answer) with the prompt rendered by the same published template.

A case is the text a model generated after the prompt, the request's settings (tools, enable_thinking,
reasoning_format) and the message llama.cpp reads out of it (content, reasoning_content, calls). They are compared as
llama.cpp's test compares them (assert_msg_equals): content and reasoning with surrounding whitespace stripped,
arguments as JSON values, call ids not at all (specrt makes its own).

A partial (still streaming) answer is read as a whole one cut there. Not read here, each counted: cases of a
continued assistant message (`messages` + `continue_final_message`: specrt continues none), and of structured output
written inside a ``` fence (`json_schema`: specrt constrains that answer to the schema, so it writes no fence)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from specrt.runtime.reasoning import THINK, prompt_leaves_open
from specrt.runtime.template_sandbox import compile_template, render_cap, render_template
from specrt.runtime.tool_detection import format_of
from specrt.runtime.tools import parse_tools, plan, read_answer
from tests.llamacpp_chat_cases import read_cases
from tests.llamacpp_source import llamacpp_source, published_template

# the published templates llama.cpp has parser cases for, by the tool format specrt reads them in
TEMPLATES = {
    "hermes": ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
               "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-QwQ-32B.jinja", "MiMo-VL.jinja"),
    "qwen_xml": ("Qwen3.5-4B.jinja", "Qwen3-Coder.jinja"),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
               "meta-llama-Llama-3.3-70B-Instruct.jinja"),
    "gemma4": ("google-gemma-4-31B-it.jinja",),
    "harmony": ("openai-gpt-oss-120b.jinja",),
}
UNMODELLED = {"messages", "continue_final_message", "add_generation_prompt"}


def _all_cases():
    text = (llamacpp_source() / "tests" / "test-chat.cpp").read_text(encoding="utf-8")
    names = {name: fmt for fmt, names in TEMPLATES.items() for name in names}
    return [(names[c.template], c) for c in read_cases(text, set(names))]


def _skip_reason(case) -> str | None:
    if UNMODELLED & set(case.other):
        return "continued assistant message"
    if case.json_schema and "```" in case.text:
        return "structured output in a fence"
    return None


CASES = _all_cases()
READ = [(fmt, c) for fmt, c in CASES if _skip_reason(c) is None]


def _prompt(template: str, case) -> str:
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in case.tools]
    messages = [{"role": "user", "content": "Hello"}]
    variables = {"enable_thinking": True if case.enable_thinking is None else case.enable_thinking}
    if tools:
        variables["tools"] = tools
    return render_template(compile_template(template), messages, render_cap(messages), add_generation_prompt=True,
                           bos_token="<s>", eos_token="</s>", **variables)


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return ""  # what llama.cpp's renormalize_json makes of text that is no JSON


@pytest.mark.parametrize("fmt, case", READ, ids=[f"{c.template}:{c.line}" for _, c in READ])
def test_llamacpp_parse_case(fmt, case):
    template = published_template(case.template)
    assert format_of(template) == fmt
    tools = parse_tools([{"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.parameters}} for t in case.tools]) \
        if case.tools else []
    choice = "required" if case.tool_choice == "REQUIRED" else "auto" if tools else "none"
    p = plan([{"role": "user", "content": "Hello"}], tools, choice, None, bool(case.parallel_tool_calls), fmt,
             template)
    open_thought = fmt != "harmony" and prompt_leaves_open(THINK, _prompt(template, case))
    said = read_answer(case.text, p, open_thought, inline=case.reasoning_format in (None, "NONE"))
    got = (said.content.strip(), said.reasoning.strip(),
           [(c["function"]["name"], _arguments(c["function"]["arguments"])) for c in said.calls])
    want = (case.expected.content.strip(), case.expected.reasoning.strip(),
            [(name, _arguments(args)) for name, args, _ in case.expected.calls])
    assert got == want, f"{case.template}:{case.line} {case.text!r}"


def test_every_format_has_cases_and_the_skipped_are_few():
    """Each format specrt speaks is held to llama.cpp's cases (llama3 has one per Llama template there: an answer
    in prose); what is not read is named (the module docstring)."""
    read = Counter(fmt for fmt, _ in READ)
    assert all(read[fmt] >= (3 if fmt == "llama3" else 6) for fmt in TEMPLATES), read
    skipped = Counter(_skip_reason(c) for _, c in CASES if _skip_reason(c) is not None)
    assert sum(skipped.values()) <= len(CASES) // 3, skipped


if __name__ == "__main__":  # the counts for the notes
    print("read:", dict(Counter(fmt for fmt, _ in READ)))
    print("skipped:", dict(Counter((fmt, _skip_reason(c)) for fmt, c in CASES if _skip_reason(c) is not None)))
