"""The chat templates' own tool formats (runtime/tool_formats.py), without a model: a template tells its format;
answers in each format are read into calls and content; Gemma 4's argument syntax reads what it writes; earlier
calls and results render the way each template takes them; the call grammars name a vocabulary's special tokens
by id (so a marker typed as text is refused) and let reasoning come first where the prompt opens a thought."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrt.runtime import gemma_values
from specrt.runtime.tokenizer import BundleTokenizer
from specrt.runtime.reasoning import style_of
from specrt.runtime.tools import ToolPlan, call_grammar, parse_tools, plan, read_output, template_format
from tests.test_tool_calls import TOOLS
from tests.tool_templates import MARKERS, TEMPLATES

pytest.importorskip("llguidance")
GIVEN = tuple(parse_tools(TOOLS))
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "sunny"}'}]


def _read(fmt: str, text: str):
    content, calls = read_output(text, ToolPlan([], {}, None, fmt, "auto", GIVEN, thought=style_of(TEMPLATES[fmt])))
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_each_template_tells_its_format():
    assert {template_format(t) for t in TEMPLATES.values()} == set(TEMPLATES)
    assert all(template_format(t) == f for f, t in TEMPLATES.items())
    assert template_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "generic"
    assert template_format(None) == "generic"


@pytest.mark.parametrize("fmt, text, content, calls", [
    ("qwen_xml", "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\nCA\n</parameter>\n"
                 "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
                 "<parameter=a>\n-3\n</parameter>\n<parameter=b>\n4\n</parameter>\n</function>\n</tool_call>",
     "Checking.", [("get_weather", {"city": "San Jose\nCA", "unit": "celsius"}), ("add", {"a": -3, "b": 4})]),
    ("qwen_xml", "<tool_call>\n<function=unknown>\n</function>\n</tool_call>",  # no given tool: left as said
     "<tool_call>\n<function=unknown>\n</function>\n</tool_call>", []),
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', None, [("add", {"a": 1, "b": 2})]),
    ("llama3", "It is sunny.", "It is sunny.", []),
    ("gemma4", '<|channel>thought\nuse the tool<channel|><|tool_call>call:get_weather{city:<|"|>Rio, {BR}<|"|>,'
               'unit:<|"|>celsius<|"|>}<tool_call|><|tool_call>call:add{a:1,b:-2}<tool_call|><|tool_response>',
     None, [("get_weather", {"city": "Rio, {BR}", "unit": "celsius"}), ("add", {"a": 1, "b": -2})]),
    ("harmony", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", "unit": "celsius"}',
     None, [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    ("harmony", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
     "Hi!", []),
    ("harmony", "plain words, no message", "plain words, no message", []),
])
def test_answers_are_read_into_calls_and_content(fmt, text, content, calls):
    assert _read(fmt, text) == (content, calls)


@pytest.mark.parametrize("value", [
    {"city": "Paris", "n": 3, "ok": True, "none": None, "nested": {"b": [1, "two", {"c": 2.5}], "a": ""},
     "odd": 'with, commas: and } braces'},
    {},
])
def test_gemma_arguments_read_what_they_write(value):
    body = gemma_values.write_value(value)[1:-1]
    assert gemma_values.parse_arguments(body) == value


def test_gemma_results_go_inside_the_calling_turn():
    from specrt.runtime.tool_formats import FORMATS

    turns = FORMATS["gemma4"].history(HISTORY + [{"role": "assistant", "content": "18 degrees and sunny."},
                                                 {"role": "user", "content": "And tomorrow?"}])
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    model = turns[1]
    assert model["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "celsius"}
    assert model["tool_responses"] == [{"name": "get_weather", "response": {"temperature": 18, "sky": "sunny"}}]
    assert model["content"] == "18 degrees and sunny."
    open_turn = FORMATS["gemma4"].history(HISTORY)  # the answer to the result continues the same turn
    assert open_turn[-1]["tool_responses"] and open_turn[-1]["content"] == ""


@pytest.mark.parametrize("fmt, expected", [
    ("qwen_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\n"
                 "celsius\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>'
               '<|tool_response>response:get_weather{sky:<|"|>sunny<|"|>,temperature:18}<tool_response|>'),
    ("harmony", 'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}<|im_end|>\n'
               '<|im_start|>ipython\n'),
])
def test_earlier_calls_render_in_the_templates_format(int4_bundle, fmt, expected):
    p = plan(HISTORY, list(GIVEN), "auto", None, True, fmt)
    tok = BundleTokenizer(int4_bundle, TEMPLATES[fmt])
    text = tok.render(p.messages, add_generation_prompt=True, variables=p.variables)
    assert expected in text
    assert "get_weather" in text.split(expected)[0]  # the tools were listed before the history
    if fmt == "gemma4":  # the turn stays open for the answer to the result
        assert not text.endswith("<|im_start|>model\n")


# -- grammars ----------------------------------------------------------------------------------------------------


def _vocabulary(bundle: Path, folder: Path, extra_special=()):
    """The default model's tokenizer with extra special tokens added at its end, and the grammar engine's view of it
    (runtime/constraint.py GrammarTokenizer, whose special_id the engine hands the call grammars)."""
    from tokenizers import Tokenizer

    from specrt.runtime.constraint import GrammarTokenizer

    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    tok.add_special_tokens(list(extra_special))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return tok, GrammarTokenizer(folder / "tokenizer.json", tok.get_vocab_size(with_added_tokens=True), [2])


def _matcher(vocabulary, grammar: str):
    import llguidance

    return llguidance.LLMatcher(vocabulary.tokenizer, grammar, log_level=0)


def _accepts(tok, matcher, text: str) -> bool:
    for t in tok.encode(text, add_special_tokens=False).ids:
        if not matcher.consume_token(t):
            return False
    return matcher.is_accepting()


GEMMA_MARKERS, HARMONY_MARKERS = MARKERS["gemma4"], MARKERS["harmony"]


@pytest.mark.parametrize("fmt, markers, good, typed", [
    ("gemma4", GEMMA_MARKERS,
     '<|channel>thought\nweather<channel|><|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,unit:<|"|>celsius<|"|>}'
     '<tool_call|>',
     '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>'),
    ("harmony", HARMONY_MARKERS,
     '<|channel|>analysis<|message|>Weather: call it.<|end|><|start|>assistant<|channel|>commentary '
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", "unit": "celsius"}',
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", "unit": '
     '"celsius"}'),
])
def test_call_grammars_take_markers_as_special_tokens(int4_bundle, tmp_path, fmt, markers, good, typed):
    """Under a vocabulary where the format's markers are special tokens the grammar accepts them as tokens, and
    refuses the same marker spelled with ordinary text tokens."""
    from tokenizers import Tokenizer

    p = ToolPlan([], {}, None, fmt, "required", GIVEN, None, True)
    tok, vocabulary = _vocabulary(int4_bundle, tmp_path, markers)
    grammar = call_grammar(p, vocabulary.special_id, open_thought=False)
    assert _accepts(tok, _matcher(vocabulary, grammar), good)
    matcher = _matcher(vocabulary, grammar)
    marker = typed.split(">")[0] + ">"  # the answer's first marker, spelled with the plain vocabulary's tokens
    spelled = Tokenizer.from_file(str(int4_bundle / "tokenizer.json")).encode(marker, add_special_tokens=False).ids
    assert len(spelled) > 1 and not matcher.consume_token(spelled[0])


def test_a_thought_may_come_before_a_required_call(int4_bundle, tmp_path):
    """Qwen3.5 with thinking on: the prompt ends in <think>, the answer reasons, closes it, then calls."""
    p = ToolPlan([], {}, None, "qwen_xml", "required", GIVEN, "add", False)
    call = "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n" \
           "</function>\n</tool_call>"
    tok, vocabulary = _vocabulary(int4_bundle, tmp_path)
    thought = call_grammar(p, vocabulary.special_id, open_thought=True)
    assert _accepts(tok, _matcher(vocabulary, thought), "Adding 2 and 3 </b> needs the tool.\n</think>\n\n" + call)
    direct = call_grammar(p, vocabulary.special_id, open_thought=False)
    assert _accepts(tok, _matcher(vocabulary, direct), call)
    assert not _accepts(tok, _matcher(vocabulary, direct), call.replace("add", "get_weather"))


def test_gemma_answers_stop_where_the_result_would_begin():
    """Gemma 4 goes on from its calls to a <|tool_response> of its own imagining: the answer ends there."""
    assert plan(HISTORY, list(GIVEN), "auto", None, True, "gemma4").stops == ("<|tool_response>",)
    assert plan(HISTORY, list(GIVEN), "none", None, True, "gemma4").stops == ()
    assert plan(HISTORY, list(GIVEN), "auto", None, True, "qwen_xml").stops == ()


@pytest.mark.parametrize("fmt, markers, prose, call, bad", [
    ("hermes", (), "Sure: it is <b>sunny</b>.", '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
     '</tool_call>', '\n<tool_call>\n{"name": "add", "arguments": {"a": "one"'),
    ("qwen_xml", (), "Let me think </think>\n\n", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"
     "<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>", "<tool_call>\n<function=subtract>"),
    ("gemma4", GEMMA_MARKERS, "<|channel>thought\nok<channel|>Calling.", "<|tool_call>call:add{a:1,b:2}<tool_call|>",
     "<|tool_call>call:add{a:<|\"|>"),
    ("llama3", (), "It is sunny.", '{"name": "add", "parameters": {"a": 1, "b": 2}}', '{"weather": '),
])
def test_auto_answers_are_free_until_a_call_opens_then_only_calls(int4_bundle, tmp_path, fmt, markers, prose, call,
                                                                  bad):
    """tool_choice auto: prose (reasoning, any markup) is free; once the format's call opener is written only a
    well-formed call of a given tool may follow, as with llama.cpp's lazy grammars."""
    p = ToolPlan([], {}, None, fmt, "auto", GIVEN, None, True)
    tok, vocabulary = _vocabulary(int4_bundle, tmp_path, markers)
    grammar = call_grammar(p, vocabulary.special_id, open_thought=False)
    for text, accepted in ((prose, True), ("" if fmt == "llama3" else prose + call, True), (call, True)):
        assert _accepts(tok, _matcher(vocabulary, grammar), text) == accepted, text
    matcher = _matcher(vocabulary, grammar)
    assert not all(matcher.consume_token(t) for t in tok.encode(prose * (fmt != "llama3") + bad,
                                                               add_special_tokens=False).ids)
    assert call_grammar(ToolPlan([], {}, None, "harmony", "auto", GIVEN, None, True), vocabulary.special_id,
                        False) is None
