"""Tool-call readers against hostile answers (issue 48): the answer is the model's, and a hostile prompt can steer
it, so reading it must stay linear. The readers once used backtracking regexes (hermes' `<tool_call>\\s*(.*?)\\s*
</tool_call>` took 33 s on 5,000 characters of openers and spaces with no closer); each format's ~100 KB worst case
must now read in well under a second. The str.find readers give what the regexes gave: the expected readings below
were taken from the regex readers before the change. A tool name with a trailing newline is refused (`$` with
`.match` let it through)."""

from __future__ import annotations

import time

import pytest

from specrt.runtime.harmony import HarmonyParser, split
from specrt.runtime.tool_formats import FORMATS
from specrt.runtime.tools import Tool, ToolError, parse_tools

STRING = {"type": "string"}
TOOLS = (  # built as parse_tools builds them, without its schema check (which needs the grammar engine)
    Tool("get_weather", "", {"type": "object", "properties": {"city": STRING,
                                                              "unit": {"enum": ["celsius", "fahrenheit"]}}}, {}),
    Tool("add", "", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}, {}),
    Tool("search", "", {"type": "object", "properties": {"query": STRING, "filters": {"type": "object"}}}, {}),
    Tool("f", "", {"type": "object", "properties": {"a": STRING}}, {}),
)
SIZE = 100_000  # the issue's size; a merely quadratic regex took 1 - 3 s at it, so those cases are 3 times larger


def _fill(unit: str, head: str = "", tail: str = "", size: int = SIZE) -> str:
    """About size characters: head, unit repeated, tail."""
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


# (format, answer): each the worst case of a regex a reader used, with the seconds that reader took before the
# change (on the 2-core VM this was written on); the str.find readers take milliseconds
HOSTILE = {
    # `<tool_call>\s*(.*?)\s*</tool_call>`: from every opener `.*?` runs to the end, `\s*` tried at each place and
    # backtracked over each run of spaces: cubic (7 s) ...
    "hermes, the issue's openers": ("hermes", _fill(' {"name": "f", "arguments": {"a": "<tool_call>   ',
                                                   head="<tool_call>")),
    # ... more so with longer runs of spaces (more than 3 minutes)
    "hermes, openers and spaces": ("hermes", _fill("<tool_call>" + " " * 40)),
    # `<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*(?:</tool_call>|$)`: calls never closed, `.*?` to the
    # end from every opener (14 s) ...
    "qwen_xml, no closers": ("qwen_xml", _fill("<tool_call><function=f>", size=3 * SIZE)),
    # ... and `</function>`s each followed by spaces and something else, all tried again from every opener (18 s)
    "qwen_xml, false closers": ("qwen_xml", _fill("<tool_call><function=f>", size=3 * SIZE // 2)
                                + _fill("</function>" + " " * 60 + "x", size=3 * SIZE // 2)),
    # `<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>` inside one call: parameters never closed (6 s)
    "qwen_xml, open parameters": ("qwen_xml", _fill("<parameter=a>\n  \n", head="<tool_call>\n<function=f>\n",
                                                    tail="</function>\n</tool_call>")),
    # `<\|tool_call>call:([A-Za-z0-9_-]+)\{(.*?)\}<tool_call\|>`: calls never closed (14 s) ...
    "gemma4, no closers": ("gemma4", _fill("<|tool_call>call:f{", size=3 * SIZE)),
    # ... and `<\|channel>.*?<channel\|>`: thoughts never closed (25 s)
    "gemma4, open thoughts": ("gemma4", _fill("<|channel>", size=3 * SIZE)),
    # no regex: the answer is one JSON object, read once (here an unclosed string, so no call)
    "llama3, one unclosed object": ("llama3", _fill("<|python_tag|> {  ", head='<|python_tag|>{"name": "f", '
                                                                              '"parameters": {"a": "')),
    # runtime/harmony.py: no regex, but it searched the rest of the answer again after every marker (19 s)
    "harmony, markers only": ("harmony", _fill("<|end|>", size=3 * SIZE)),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_answers_read_in_well_under_a_second(case):
    fmt, text = HOSTILE[case]
    assert len(text) > 0.99 * SIZE
    t0 = time.perf_counter()
    FORMATS[fmt].read(text, TOOLS)
    assert time.perf_counter() - t0 < 1.0


NESTED = "[" * 100_000  # past json's recursion limit: a RecursionError, not a ValueError, once escaped the readers
DEEP = {"hermes": f"<tool_call>{NESTED}</tool_call>", "llama3": f"<|python_tag|>{{\"name\": \"f\", "
        f"\"parameters\": {NESTED}}}", "qwen_xml": f"<tool_call>\n<function=f>\n<parameter=a>\n{NESTED}\n"
        f"</parameter>\n</function>\n</tool_call>", "gemma4": f"<|tool_call>call:f{{a:{NESTED}}}<tool_call|>",
        "harmony": f"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{NESTED}<|call|>"}


@pytest.mark.parametrize("fmt", list(DEEP))
def test_deeply_nested_arguments_are_read_not_raised(fmt):
    """JSON arguments nested past the parser's limit are not JSON: no call (Qwen's XML form keeps a parameter that
    is not JSON as its text, as for any other)."""
    content, calls = FORMATS[fmt].read(DEEP[fmt], TOOLS)
    assert calls == ([("f", {"a": NESTED})] if fmt == "qwen_xml" else [])


def test_harmony_streamed_markers_stay_linear():
    """The parser as the engine drives it, chunk by chunk."""
    parser, text = HarmonyParser(), HOSTILE["harmony, markers only"][1]
    t0 = time.perf_counter()
    for i in range(0, len(text), 4096):
        parser.feed(text[i:i + 4096])
    parser.finish()
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("name", ["get\n", "a" * 64 + "\n", "\nget", "a" * 65, "", "get weather", "get.weather"])
def test_bad_tool_names_are_refused(name):
    with pytest.raises(ToolError, match=r"tools\[0\]\.function\.name must be 1-64 letters, digits, _ or -, got "):
        parse_tools([{"type": "function", "function": {"name": name}}])


def test_good_tool_names_pass():
    pytest.importorskip("llguidance")
    names = ["get_weather", "a" * 64, "x-1"]
    assert [t.name for t in parse_tools([{"type": "function", "function": {"name": n}} for n in names])] == names


# (format, answer, content, calls), read by the regex readers before the change. hermes: nested JSON, two calls,
# text around them, an unknown tool, an unclosed last call (not read), a body that is no JSON, an opener inside a
# call, odd whitespace, a closer inside a JSON string. qwen_xml: string and JSON values, a call closed by the
# answer's end, a false `</function>`, names with spaces or a newline, values with and without their newlines,
# an unclosed parameter, text between calls, an opener inside a name. gemma4: thoughts closed and not, a name
# with a dot, an unknown tool, a closer inside a string, a call inside a call, a tool response after the calls.
SAME_AS_BEFORE = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>',
     "", [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "a {b} [c]", "filters": '
              '{"tags": ["x", {"y": null}], "n": 2.5}}}\n</tool_call>',
     "Let me look.", [("search", {"query": "a {b} [c]", "filters": {"tags": ["x", {"y": None}], "n": 2.5}})]),
    ("hermes", 'Two:\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": -2}}\n</tool_call>\nDone.',
     "Two:\n\n\nDone.", [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("add", {"a": 1, "b": -2})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>',
     "", [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1',
     "", [("get_weather", {"city": "Oslo", "unit": "celsius"})]),  # a last call cut off is no content (issue 49)
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}', []),
    ("hermes", "<tool_call>\nnot json\n</tool_call> after",
     "<tool_call>\nnot json\n</tool_call> after", []),
    ("hermes", '<tool_call> x <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": '
              '"celsius"}}\n</tool_call> tail',
     '<tool_call> x <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
     "</tool_call> tail", []),
    ("hermes", '<tool_call>\t\r\n {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}} \xa0\n'
              "</tool_call>",
     "", [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    ("hermes", '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
     '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', []),
    ("hermes", '<tool_call>\n{"name": "search", "arguments": {"query": "</tool_call>"}}\n</tool_call>',
     '<tool_call>\n{"name": "search", "arguments": {"query": "</tool_call>"}}\n</tool_call>', []),
    ("hermes", "No call here.  ",
     "No call here.  ", []),
    ("hermes", "<tool_call></tool_call>",
     "<tool_call></tool_call>", []),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}</tool_call>'
              '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}</tool_call>',
     "",
     [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    ("hermes", '</tool_call><tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
              "</tool_call></tool_call>",
     "</tool_call></tool_call>", [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    ("qwen_xml", "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\nCA\n</parameter>\n"
                "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
                "<parameter=a>\n-3\n</parameter>\n<parameter=b>\n4\n</parameter>\n</function>\n</tool_call>",
     "Checking.", [("get_weather", {"city": "San Jose\nCA", "unit": "celsius"}), ("add", {"a": -3, "b": 4})]),
    ("qwen_xml", "<tool_call>\n<function=unknown>\n</function>\n</tool_call>",
     "<tool_call>\n<function=unknown>\n</function>\n</tool_call>", []),
    ("qwen_xml", "<tool_call>\n<function=search>\n<parameter=query>\n\n two lines \n\n</parameter>\n"
                '<parameter=filters>\n{"tags": ["x", {"y": null}]}\n</parameter>\n</function>\n</tool_call> after',
     "after", [("search", {"query": "\n two lines \n", "filters": {"tags": ["x", {"y": None}]}})]),
    ("qwen_xml", "<tool_call>\n<function=add>\n<parameter=a>\nnot a number\n</parameter>\n<parameter=zz>\n[1]\n"
                "</parameter>\n</function>\n",
     "", [("add", {"a": "not a number", "zz": [1]})]),
    ("qwen_xml", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>",
     "", [("add", {"a": 1})]),
    ("qwen_xml", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function> junk </function>\n"
                "</tool_call>",
     "", [("add", {"a": 1})]),
    ("qwen_xml", "<tool_call>\n<function=add>\n</function> junk\n",
     "<tool_call>\n<function=add>\n</function> junk\n", []),
    ("qwen_xml", "<tool_call>\n<function= get_weather >\n<parameter= city >Rome</parameter>\n</function>\n"
                "</tool_call>",
     "", [("get_weather", {"city": "Rome"})]),
    ("qwen_xml", "<tool_call>\n<function=get\nweather>\n</function>\n</tool_call>",
     "<tool_call>\n<function=get\nweather>\n</function>\n</tool_call>", []),
    ("qwen_xml", "<tool_call>\n<function=add>\n<parameter=a>5</parameter><parameter=b>\n\n</parameter>\n"
                "</function>\n</tool_call>",
     "", [("add", {"a": 5, "b": ""})]),
    ("qwen_xml", "<tool_call>\n<function=add>\n<parameter=a>\n5\n</function>\n</tool_call>",
     "", [("add", {})]),
    ("qwen_xml", "A <tool_call>\n<function=add>\n</function>\n</tool_call> B <tool_call> <function=get_weather>"
                "<parameter=city>\nX\n</parameter></function></tool_call> C",
     "A  B  C", [("add", {}), ("get_weather", {"city": "X"})]),
    ("qwen_xml", "<tool_call><tool_call>\n<function=add>\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>",
     "", [("add", {"b": 2})]),  # a stray opener is no content (issue 49)
    ("qwen_xml", "<tool_call>\n<function=a<tool_call><function=add>\n</function>\n</tool_call>",
     "<tool_call>\n<function=a<tool_call><function=add>\n</function>\n</tool_call>", []),
    ("qwen_xml", "<tool_call>\n<function=add>\n<parameter=a\n>1</parameter><parameter=b>\n\n\n</parameter>\n"
                "</function>\n</tool_call>",
     "", [("add", {"b": "\n"})]),
    ("qwen_xml", "<tool_call>\n<function=add>\n</function>\n</tool_call>\n",
     "", [("add", {})]),
    ("qwen_xml", "<tool_call>\n<function=>\n</function>\n</tool_call>",
     "<tool_call>\n<function=>\n</function>\n</tool_call>", []),
    ("qwen_xml", "plain text",
     "plain text", []),
    ("gemma4", '<|channel>thought\nuse the tool<channel|><|tool_call>call:get_weather{city:<|"|>Rio, {BR}<|"|>,unit:'
              '<|"|>celsius<|"|>}<tool_call|><|tool_call>call:add{a:1,b:-2}<tool_call|><|tool_response>',
     "", [("get_weather", {"city": "Rio, {BR}", "unit": "celsius"}), ("add", {"a": 1, "b": -2})]),
    ("gemma4", 'Sure. <|tool_call>call:search{filters:{n:2.5,tags:[<|"|>x<|"|>,{y:null}]},query:<|"|>a b<|"|>}'
              "<tool_call|> ok",
     "Sure.  ok", [("search", {"filters": {"n": 2.5, "tags": ["x", {"y": None}]}, "query": "a b"})]),
    ("gemma4", "<|channel>thought\nunclosed <|tool_call>call:add{a:1,b:2}<tool_call|>",
     "", [("add", {"a": 1, "b": 2})]),  # an unclosed thought ends at the call (issue 49: no marker in content)
    ("gemma4", "<|tool_call>call:add{a:1,b:2<tool_call|>",
     "<|tool_call>call:add{a:1,b:2<tool_call|>", []),
    ("gemma4", '<|tool_call>call:get.weather{city:<|"|>x<|"|>}<tool_call|>',
     '<|tool_call>call:get.weather{city:<|"|>x<|"|>}<tool_call|>', []),
    ("gemma4", "<|tool_call>call:unknown{a:1}<tool_call|> text",
     "<|tool_call>call:unknown{a:1}<tool_call|> text", []),
    ("gemma4", "<|tool_call>call:add{a:1,b:2}<tool_call|> before <|tool_response>response:add{r:3}<tool_response|> "
              "after",
     "before", [("add", {"a": 1, "b": 2})]),
    ("gemma4", '<|tool_call>call:search{query:<|"|>has }<tool_call|> inside<|"|>}<tool_call|>',
     '<|tool_call>call:search{query:<|"|>has }<tool_call|> inside<|"|>}<tool_call|>', []),
    ("gemma4", "<|tool_call>call:add{a:1,b:2}",
     "<|tool_call>call:add{a:1,b:2}", []),
    ("gemma4", "<|tool_call>call:{a:1}<tool_call|>",
     "<|tool_call>call:{a:1}<tool_call|>", []),
    ("gemma4", "<|channel>a<channel|>x<|channel>b<channel|>y <|tool_call>call:add{}<tool_call|>",
     "xy", [("add", {})]),
    ("gemma4", "<|tool_call>call:add{a:1}<tool_call|><|tool_call>call:add{b:<|tool_call>call:add{a:2}<tool_call|>",
     "", [("add", {"a": 1}), ("add", {"b": "<|tool_call>call:add{a:2"})]),
    ("gemma4", "no call",
     "no call", []),
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}',
     "", [("add", {"a": 1, "b": 2})]),
    ("llama3", '  {"name": "search", "arguments": {"query": "q", "filters": {"x": [1]}}}  ',
     "", [("search", {"query": "q", "filters": {"x": [1]}})]),
    ("llama3", "It is sunny.",
     "It is sunny.", []),
    ("llama3", '{"name": "add", "parameters": {"a": 1',
     '{"name": "add", "parameters": {"a": 1', []),
    ("llama3", '{"name": "unknown", "parameters": {}}',
     '{"name": "unknown", "parameters": {}}', []),
    ("harmony", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
               'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", "unit": "celsius"}',
     "", [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    ("harmony", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
     "Hi!", []),
    ("harmony", "plain words, no message",
     "plain words, no message", []),
    ("harmony", "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.add<|channel|>commentary json"
               '<|message|>{"a": 1, "b": 2}<|call|>',
     "", [("add", {"a": 1, "b": 2})]),
    ("harmony", "<|channel|>final<|message|>partial marker at the end <|en",
     "partial marker at the end <|en", []),
    ("harmony", "<|channel|>final<|message|>a<|end|>stray<|start|>assistant<|channel|>final<|message|>b<|return|>",
     "ab", []),
    ("harmony", '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1',
     "", []),
    ("harmony", "<|channel|>analysis<|message|><|end|><|end|><|start|><|message|>odd<|channel|>x",
     "oddx", []),
]


@pytest.mark.parametrize("fmt, text, content, calls", SAME_AS_BEFORE)
def test_readers_read_as_before(fmt, text, content, calls):
    said = FORMATS[fmt].answer(text, TOOLS, None, False)  # a format's own thought (Gemma's channel) goes first
    assert (said.content, said.calls) == (content, calls)


# (answer, (reasoning, the rest)), split by the harmony parser before the change, except that a message to a
# function is neither reasoning nor the rest now (issue 49)
SPLIT_AS_BEFORE = [
    ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", "unit": "celsius"}',
     ("Need weather.", "")),  # a call's arguments are neither (issue 49: they were the rest)
    ("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
     ("Easy.", "Hi!")),
    ("plain words, no message",
     ("", "")),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.add<|channel|>commentary json"
     '<|message|>{"a": 1, "b": 2}<|call|>',
     ("x", "")),
    ("<|channel|>final<|message|>partial marker at the end <|en",
     ("", "partial marker at the end <|en")),
    ("<|channel|>final<|message|>a<|end|>stray<|start|>assistant<|channel|>final<|message|>b<|return|>",
     ("", "ab")),
    ('<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1',
     ("", "")),
    ("<|channel|>analysis<|message|><|end|><|end|><|start|><|message|>odd<|channel|>x",
     ("", "oddx")),
]


@pytest.mark.parametrize("text, expected", SPLIT_AS_BEFORE)
def test_harmony_splits_as_before_whole_and_streamed(text, expected):
    assert split(text) == expected
    whole = HarmonyParser()
    pieces = [(p.channel, p.recipient, p.text) for p in whole.feed(text) + whole.finish()]
    for size in (1, 2, 3, 7):  # in chunks the pieces come split up, but they join into the same messages
        parser = HarmonyParser()
        streamed = [p for i in range(0, len(text), size) for p in parser.feed(text[i:i + size])] + parser.finish()
        assert _joined([(p.channel, p.recipient, p.text) for p in streamed]) == _joined(pieces)


def _joined(pieces):
    out = []
    for channel, recipient, text in pieces:
        if out and out[-1][:2] == (channel, recipient):
            out[-1] = (channel, recipient, out[-1][2] + text)
        else:
            out.append((channel, recipient, text))
    return out
