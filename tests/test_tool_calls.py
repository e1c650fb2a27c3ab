"""Tool calls (runtime/tools.py) on the real default model: forced (`required`) and named calls parse and fit their
parameters, in the generic format (the default model's template has no tool format) and in each template's own format
(the same model under templates shaped like Qwen2.5's, Qwen3.5's, Llama 3's, Gemma 4's and gpt-oss's:
tests/tool_templates.py); every drafter gives the same greedy calls as none; bad tools are named."""

from __future__ import annotations

import json

import pytest

import specrt
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.tools import ToolError, ToolPlan, parse_choice, parse_tools, read_output, template_format
from tests.tool_templates import TEMPLATES

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
    assert template_format(TEMPLATES["hermes"]) == "hermes" and template_format("{{ messages }}") == "generic"


def test_hermes_content_streams_up_to_a_call():
    from specrt.runtime.tools import CallContent

    stream = CallContent("<tool_call>")
    sent = [stream.feed(c) for c in ("Sure, <b>", "checking <to", "ol_call>\n{\"na", "me\": 1}")]
    assert sent == ["Sure, <b>", "checking ", "", ""] and stream.finish(called=True) == ""
    broken = CallContent("<tool_call>")
    text = "".join(broken.feed(c) for c in ("a <tool", "_call> {not json"))
    assert text + broken.finish(called=False) == "a <tool_call> {not json"
    plain = CallContent("<tool_call>")
    assert plain.feed("ends with <tool") == "ends with " and plain.finish(called=False) == "<tool"


@pytest.fixture(scope="module")
def engine(int4_bundle):
    return specrt.load(str(int4_bundle), device="cpu", batch_invariant=True)


@pytest.fixture
def templated(engine, request):
    """The engine under one tool format's template (tests/tool_templates.py) for one test; "generic": its own."""
    from specrt.runtime.tokenizer import BundleTokenizer

    kept = engine.tokenizer
    if request.param != "generic":
        engine.tokenizer = BundleTokenizer(engine.bundle_dir, TEMPLATES[request.param])
    assert template_format(engine.tokenizer.template_source) == request.param  # the format is told by its template
    yield engine
    engine.tokenizer = kept


ASK = "What is the weather in Paris, in celsius?"


@pytest.mark.parametrize("templated", ["generic", *TEMPLATES], indirect=True)
def test_required_and_named_calls_parse_and_fit_their_parameters(templated):
    e = templated
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


@pytest.mark.parametrize("templated, kind", [("generic", "ngram"), ("generic", "eagle3"), ("generic", "dflash"),
                                             pytest.param("qwen_xml", "ngram", marks=pytest.mark.full)],
                         indirect=["templated"])
def test_every_drafter_makes_the_same_greedy_calls(templated, kind):
    from specrt.app.api import make_drafter

    engine = templated
    drafter = make_drafter(kind, engine.bundle_dir, engine.manifest, engine.providers)
    for choice in ("required", "auto"):
        engine.grammar_drafts = False
        try:
            plain = engine.generate(ASK, PARAMS, drafter=None, tools=TOOLS, tool_choice=choice).wait()
        finally:
            engine.grammar_drafts = True
        out = engine.generate(ASK, PARAMS, drafter=drafter, tools=TOOLS, tool_choice=choice).wait()
        assert out.token_ids == plain.token_ids, (kind, choice)


@pytest.mark.parametrize("fmt", ["gemma4", pytest.param("harmony", marks=pytest.mark.full)])  # harmony: also serve_real
def test_markers_that_are_special_tokens_are_written_and_read_as_such(int4_bundle, tmp_path, fmt):
    """Under a vocabulary where the format's markers are special tokens (as in Gemma 4's and gpt-oss's), a required
    call is written with those tokens (not their spelling in text) and read back from the decoded answer."""
    from specrt.runtime.tokenizer import BundleTokenizer
    from tests.tool_templates import MARKERS, bundle_with_markers

    folder, ids = bundle_with_markers(int4_bundle, tmp_path / "b", MARKERS[fmt])
    engine = specrt.load(str(folder), device="cpu", batch_invariant=True, drafter=None)
    engine.tokenizer = BundleTokenizer(folder, TEMPLATES[fmt])
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        out = engine.generate(ASK, PARAMS, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False).wait()
        assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1, out.text
        _fits(out.tool_calls[0])
        opener = ids["<|tool_call>"] if fmt == "gemma4" else ids["<|constrain|>"]
        assert opener in out.token_ids


@pytest.mark.parametrize("templated", ["hermes", pytest.param("qwen_xml", marks=pytest.mark.full),
                                       pytest.param("gemma4", marks=pytest.mark.full)], indirect=True)
def test_auto_calls_the_model_opens_are_whole(templated):
    """tool_choice auto in a format whose calls open with a marker: a call the model starts is finished well formed
    (under the hermes template this model does start one), so no half call is left in the text."""
    from specrt.runtime.tool_formats import FORMATS
    from specrt.runtime.tools import template_format

    out = templated.generate(ASK, PARAMS, tools=TOOLS, tool_choice="auto").wait()
    fmt = FORMATS[template_format(templated.tokenizer.template_source)]
    assert fmt.opener not in out.text
    for call in out.tool_calls or ():
        _fits(call)
    if fmt.name == "hermes":
        assert out.finish_reason == "tool_calls" and out.tool_calls
