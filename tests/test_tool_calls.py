"""Tool calls (runtime/tools.py) on the real default model: forced (`required`) and named calls parse and fit their
parameters, in the generic format (the default model's template has no tool format) and in the hermes format
(the same model under a template that writes <tool_call> blocks, as Qwen2.5's does); every drafter gives the same
greedy calls as none; bad tools are named."""

from __future__ import annotations

import json

import pytest

import specrt
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.tools import ToolError, ToolPlan, parse_choice, parse_tools, read_output, template_format

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                                    "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMS = SamplingParams(max_new_tokens=96)
# a ChatML template with a tool format of the hermes kind (Qwen2.5's writes the same blocks)
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n<tools>\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}{%- endfor %}\n</tools>\nTo call one, write <tool_call>\n{\"name\": NAME, \"arguments\": "
    "ARGS}\n</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}\n<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n{{ {'name': c.function.name, 'arguments': "
    "c.function.arguments} | tojson }}\n</tool_call>{%- endfor %}<|im_end|>{%- endfor %}"
    "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}"
)


def _fits(call: dict, tools=TOOLS) -> dict:
    import jsonschema

    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call["function"]["name"])
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, schema)
    assert call["type"] == "function" and call["id"].startswith("call_")
    return args


@pytest.mark.parametrize("tools, choice, message", [
    ([], "auto", "'tools' must be a non-empty list"),
    ([{"type": "function", "function": {"name": "has space"}}], "auto", r"tools\[0\].function.name must be"),
    ([WEATHER, WEATHER], "auto", "is given twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}], "auto",
     r"tools\[0\].function.parameters: the JSON schema cannot be used"),
    (TOOLS, {"type": "function", "function": {"name": "search"}}, "names the function 'search', which is not among"),
    (TOOLS, "sometimes", "tool_choice must be none, auto, required"),
])
def test_bad_tools_are_named(tools, choice, message):
    with pytest.raises(ToolError, match=message):
        parse_choice(choice, parse_tools(tools))


def test_hermes_output_is_read_into_calls_and_content():
    plan = ToolPlan([], {}, None, "hermes", "auto", tuple(parse_tools(TOOLS)))
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>')
    content, calls = read_output(text, plan)
    assert content == "Let me look." and len(calls) == 1 and _fits(calls[0]) == {"city": "Oslo", "unit": "celsius"}
    assert read_output("no call here", plan) == ("no call here", [])
    assert template_format(HERMES_TEMPLATE) == "hermes" and template_format("{{ messages }}") == "generic"


def test_hermes_content_streams_up_to_a_call():
    from specrt.runtime.tools import HermesContent

    stream = HermesContent()
    sent = [stream.feed(c) for c in ("Sure, <b>", "checking <to", "ol_call>\n{\"na", "me\": 1}")]
    assert sent == ["Sure, <b>", "checking ", "", ""] and stream.finish(called=True) == ""
    broken = HermesContent()
    text = "".join(broken.feed(c) for c in ("a <tool", "_call> {not json"))
    assert text + broken.finish(called=False) == "a <tool_call> {not json"
    plain = HermesContent()
    assert plain.feed("ends with <tool") == "ends with " and plain.finish(called=False) == "<tool"


@pytest.fixture(scope="module")
def engine(int4_bundle):
    return specrt.load(str(int4_bundle), device="cpu", batch_invariant=True)


@pytest.fixture
def hermes(engine):
    """The engine under HERMES_TEMPLATE for one test."""
    from specrt.runtime.tokenizer import BundleTokenizer

    kept = engine.tokenizer
    engine.tokenizer = BundleTokenizer(engine.bundle_dir, HERMES_TEMPLATE)
    yield engine
    engine.tokenizer = kept


ASK = "What is the weather in Paris, in celsius?"


@pytest.mark.parametrize("fmt", ["generic", "hermes"])
def test_required_and_named_calls_parse_and_fit_their_parameters(engine, request, fmt):
    e = request.getfixturevalue("hermes") if fmt == "hermes" else engine
    for choice, parallel in (("required", False), ("required", True),
                             ({"type": "function", "function": {"name": "add"}}, False)):
        out = e.generate(ASK, PARAMS, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel).wait()
        assert out.finish_reason == "tool_calls" and out.tool_calls, (choice, out.text)
        assert parallel or len(out.tool_calls) == 1
        for call in out.tool_calls:
            _fits(call)
            if isinstance(choice, dict):
                assert call["function"]["name"] == "add"
        assert out.stats.forced_accepted > 0  # the call's fixed parts came from the grammar, several a target call


def test_auto_none_and_a_tool_result_turn(engine):
    """auto (generic: a call or a response, constrained), none (plain text, no tools shown), and a history holding
    an earlier call and its result."""
    auto = engine.generate(ASK, PARAMS, tools=TOOLS, tool_choice="auto").wait()
    assert (auto.finish_reason == "tool_calls") == bool(auto.tool_calls)
    for call in auto.tool_calls or ():
        _fits(call)
    none = engine.generate(ASK, PARAMS, tools=TOOLS, tool_choice="none").wait()
    assert none.tool_calls is None and none.text and "tool_call" not in none.text
    history = [{"role": "user", "content": ASK},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    after = engine.generate(history, PARAMS, tools=TOOLS, tool_choice="auto").wait()
    assert after.text or after.tool_calls


@pytest.mark.parametrize("kind", ["ngram", "eagle3", "dflash"])
def test_every_drafter_makes_the_same_greedy_calls(engine, kind):
    from specrt.app.api import make_drafter

    drafter = make_drafter(kind, engine.bundle_dir, engine.manifest, engine.providers)
    for choice in ("required", "auto"):
        engine.grammar_drafts = False
        try:
            plain = engine.generate(ASK, PARAMS, drafter=None, tools=TOOLS, tool_choice=choice).wait()
        finally:
            engine.grammar_drafts = True
        out = engine.generate(ASK, PARAMS, drafter=drafter, tools=TOOLS, tool_choice=choice).wait()
        assert out.token_ids == plain.token_ids, (kind, choice)
