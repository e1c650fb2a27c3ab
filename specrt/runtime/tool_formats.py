"""The chat templates' own tool-call formats: how earlier calls go back to the template, a grammar for an answer
that must call, and how calls are read out of an answer.

- hermes (Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several in a row.
- qwen_xml (Qwen3.5, Qwen3.6, Qwen3-Coder): `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n
  ...</function>\\n</tool_call>`; a string VALUE is written as it is, any other as JSON.
- llama3 (Llama 3.1 - 3.3): the whole answer is one JSON object `{"name": ..., "parameters": {...}}`.
- gemma4 (Gemma 4): `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>` (runtime/gemma_values.py); results go back
  inside the model's turn, as the template's `tool_responses`.
- harmony (gpt-oss): after the analysis (reasoning) message, a commentary message to `functions.NAME` with
  `<|constrain|>json` and the arguments' JSON, ended by `<|call|>`; one call per answer.

Each lists the tools through its template's own `tools` variable. Reading is lenient (a call that does not parse or
names no given tool is left in the content); answers that must call are constrained by the grammar, so they parse.
The readers scan with str.find, each stretch of the answer a bounded number of times, never with backtracking
regexes: the answer is the model's (a hostile prompt can steer it), and `<tool_call>\\s*(.*?)\\s*</tool_call>` took
33 s on 5,000 characters of openers and spaces with no closer (tests/test_tool_readers_hostile.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specrt.runtime import gemma_values, reasoning
from specrt.runtime.tool_grammar import LarkBuilder, alternatives, regex_text, sequence

THINK_OPEN, THINK_CLOSE = reasoning.THINK.open, reasoning.THINK.close
_WS = "/[ \\n]*/"


class _Ahead:
    """The next place of what `find(pos)` looks for, at or after pos, for positions that (mostly) only grow: a
    search is redone only once pos passes the place found, so many openers with no closer after them cost one
    search, not one each (what made a lazy `.*?closer` regex quadratic)."""

    def __init__(self, find):
        self.find, self.start, self.at = find, None, -1

    def __call__(self, pos: int) -> int:
        if self.start is None or pos < self.start or 0 <= self.at < pos:
            self.start, self.at = pos, self.find(pos)
        return self.at


def _space_end(text: str, i: int) -> int:
    """Where the whitespace from i ends (str.isspace is regex `\\s`, and str.strip's whitespace)."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _between(text: str, opener: str, closer: str) -> list[tuple[int, int, str]]:
    """[(start, end, inside)]: each opener to the first closer after it, the next opener looked for after that
    closer; what `opener(.*?)closer` (re.S) finds."""
    spans, at = [], 0
    while (start := text.find(opener, at)) >= 0:
        close = text.find(closer, start + len(opener))
        if close < 0:
            break  # no closer after this opener, so none after a later one either
        spans.append((start, close + len(closer), text[start + len(opener):close]))
        at = close + len(closer)
    return spans


def _cut(text: str, spans) -> str:
    """text without the spans (start, end, ...), which are in order and apart: what re.sub("", ...) leaves."""
    out, at = [], 0
    for start, end, *_ in spans:
        out.append(text[at:start])
        at = end
    return "".join(out) + text[at:]


def _unfinished_cut(content: str, opener: str = "<tool_call>", closer: str = "</tool_call>") -> str:
    """An answer's content, less a last call cut off by the token limit (an opener with no closer after it): after
    calls that were read, the start of one more is no text of the answer."""
    last = content.rfind(opener)
    return content[:last] if last >= 0 and content.find(closer, last) < 0 else content


def _name_end(gt: _Ahead, newline: _Ahead, i: int) -> int:
    """Where `[^>\\n]+>` from i puts its `>`: the first `>` after i with no newline before it and a name (one
    character or more) between; -1 where there is none. gt and newline find the next `>` and newline."""
    end = gt(i)
    return end if end > i and not 0 <= newline(i) < end else -1


def call_object(tool, arguments_key: str = "arguments") -> dict:
    """The JSON schema of one call of tool: {"name": its name, arguments_key: its parameters}."""
    return {"type": "object", "properties": {"name": {"const": tool.name}, arguments_key: tool.parameters},
            "required": ["name", arguments_key], "additionalProperties": False}


def loads_or(text: str, default=None):
    """json.loads(text), or default where text is not JSON, or nests past the parser's recursion limit (a
    RecursionError, not a ValueError: an answer of 100,000 brackets raised it out of every reader)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return default


def object_arguments(value) -> object:
    """A history call's arguments as templates read them: an object (OpenAI sends a JSON string)."""
    return loads_or(value, value) if isinstance(value, str) else value


def objects_history(messages: list[dict]) -> list[dict]:
    """OpenAI's history with each call's arguments an object and every content a string (None -> "")."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"type": "function", "id": c.get("id"), "function": {
                "name": c["function"]["name"], "arguments": object_arguments(c["function"]["arguments"])}}
                for c in m["tool_calls"]]
        m["content"] = m.get("content") or ""
        out.append(m)
    return out


@dataclass(frozen=True)
class Answer:
    """An answer, read: what it says, its thought (reasoning_content) and its calls [(name, arguments)]."""
    content: str
    reasoning: str
    calls: list


class ToolFormat:
    name = ""
    opener: str | None = None  # where a call begins in free text (content streams up to it)
    openers: tuple[str, ...] = ()  # every text a call may begin with (Qwen3-Coder's models leave out the opener)
    thought: reasoning.ThoughtStyle | None = None  # the format's own thought markers (else the template's)
    several = True  # the format writes several calls in one answer
    stops: tuple[str, ...] = ()  # text that ends an answer with calls (where the model goes on to imagine results)

    def matches(self, template: str) -> bool:
        raise NotImplementedError

    def history(self, messages: list[dict], template: str | None = None) -> list[dict]:
        """The conversation as the template takes it (each call's arguments an object)."""
        return objects_history(messages)

    def call(self, tool, b: LarkBuilder) -> str:
        """A grammar expression for one call of `tool`: the opener, then the body."""
        return f"{b.lit(self.opener)} {self.body(tool, b)}"

    def body(self, tool, b: LarkBuilder) -> str:
        """A call after its opener (formats with one)."""
        raise NotImplementedError

    def preamble(self, b: LarkBuilder, open_thought: bool, thinks: bool = False) -> str:
        """What may come before the calls: the thought the prompt left open (to its closer), or one the model may
        open itself (thinks: the template writes `<think>`); an expression, or "". Inside it a call's opener is
        thought, not a call."""
        if open_thought:
            return f"{b.upto(THINK_CLOSE)} {_WS}"
        return f"({b.lit(THINK_OPEN)} {b.upto(THINK_CLOSE)} {_WS})?" if thinks else ""

    def thought_opener(self, thinks: bool) -> str | None:
        """The marker that opens a thought the model writes itself (kept out of the free text before a call)."""
        return THINK_OPEN if thinks else None

    def between(self) -> str:
        return ""

    def _calls(self, tools, parallel: bool, b: LarkBuilder, opened: str | None = None) -> str:
        """One call (several where allowed); opened: the first call's beginning already written (the format's
        opener, or another of its openers: QwenXml's `<function=`)."""
        one = alternatives([self.call(t, b) for t in tools])
        one = b.rule(one, "call") if len(tools) > 1 else one
        first = b.rule(alternatives([self.after(opened, t, b) for t in tools]), "body") if opened else one
        return f"{first} ({self.between()} {one})*" if parallel and self.several else first

    def after(self, opener: str, tool, b: LarkBuilder) -> str:
        """A call of tool once `opener` (one of the format's openers) is written."""
        return self.body(tool, b)

    def grammar(self, tools, parallel: bool, b: LarkBuilder, open_thought: bool, thinks: bool = False) -> str:
        """An answer that must call (tool_choice required or named)."""
        return b.grammar(" ".join(x for x in (self.preamble(b, open_thought, thinks),
                                              self._calls(tools, parallel, b)) if x))

    def auto_grammar(self, tools, parallel: bool, b: LarkBuilder, open_thought: bool = False,
                     thinks: bool = False) -> str | None:
        """An answer that may call (tool_choice auto): its thought first (free, a call's opener in it included),
        then free text up to one of the format's openers and only well-formed calls of the given tools after it,
        as llama.cpp's lazy grammars do; None where the format has no opener to wait for."""
        if self.opener is None:
            return None
        pre = self.preamble(b, open_thought, thinks)
        pre = f"{pre} " if pre else ""
        if b.is_special(self.opener):  # any token but the opener (and a thought's opener), then calls
            kept_out = [b.special_id(m) for m in (self.opener, self.thought_opener(thinks)) if m]
            any_other = "<[^" + ",".join(str(i) for i in kept_out if i is not None) + "]>*"
            return b.grammar(f"{pre}{any_other} ({b.lit(self.opener)} {self._calls(tools, parallel, b, self.opener)})?")
        # a thought the model opens itself comes first: text that starts with its opener is no free text (else a
        # call's opener inside the thought would start the calls)
        not_first = self.thought_opener(thinks) if not open_thought else None
        openers = self.openers or (self.opener,)
        free = b.define("FREE", "/(.|\\n)*/ & ~/(.|\\n)*(" + "|".join(regex_text(o) for o in openers) + ")(.|\\n)*/"
                        + (f" & ~/{regex_text(not_first)}(.|\\n)*/" if not_first else ""))
        calls = [f"{b.upto(o, not_first=not_first or '')} {self._calls(tools, parallel, b, o)}" for o in openers]
        return b.grammar(f"{pre}({' | '.join([free, *calls])})")

    def read(self, text: str, tools) -> tuple[str, list[tuple[str, dict]]]:
        """An answer after its thought -> (its content without the calls, [(name, arguments)])."""
        raise NotImplementedError

    def answer(self, text: str, tools, thought: reasoning.ThoughtStyle | None, open_thought: bool) -> Answer:
        """A whole answer -> Answer: the thought first (runtime/reasoning.py: a call's marker inside it is thought,
        not a call), then the calls in what follows it."""
        said, rest = reasoning.split(text, self.thought or thought, open_thought,
                                     self.openers or ((self.opener,) if self.opener else ()))
        content, calls = self.read(rest, tools) if tools else (rest, [])
        return Answer(content, said, calls)


class Hermes(ToolFormat):
    name, opener = "hermes", "<tool_call>"

    def matches(self, template):
        return "<tool_call>" in template and "tools" in template

    def between(self):
        return '"\\n"'

    def body(self, tool, b):
        return f'"\\n" {b.json(call_object(tool))} "\\n" {b.lit("</tool_call>")}'

    def read(self, text, tools):
        names, calls = {t.name for t in tools}, []
        found = _between(text, "<tool_call>", "</tool_call>")  # the body is what is inside, stripped
        for _, _, body in found:
            value = loads_or(body.strip())
            if isinstance(value, dict) and value.get("name") in names and isinstance(value.get("arguments"), dict):
                calls.append((value["name"], value["arguments"]))
        return (_unfinished_cut(_cut(text, found)).strip() if calls else text), calls


def _is_text(schema) -> bool:
    if not isinstance(schema, dict):
        return False
    if "enum" in schema and isinstance(schema["enum"], list):
        return all(isinstance(v, str) for v in schema["enum"])
    kinds = schema.get("type")
    return kinds == "string" or (isinstance(kinds, list) and "string" in kinds)


class QwenXml(ToolFormat):
    name, opener = "qwen_xml", "<tool_call>"
    openers = ("<tool_call>", "<function=")
    _END = "\n</parameter>\n"

    def matches(self, template):
        return "<function=" in template and "<parameter=" in template

    def between(self):
        return '"\\n"'

    def body(self, tool, b):
        return f'"\\n<function=" {self.after("<function=", tool, b)}'

    def after(self, opener, tool, b):
        """After `<tool_call>`: the body; after a bare `<function=` (no opener written): the rest of that call."""
        if opener != "<function=":
            return self.body(tool, b)
        props = tool.parameters.get("properties") or {}
        required = set(tool.parameters.get("required", ()))
        items = [(f"{json.dumps(f'<parameter={key}>' + chr(10))} {self._value(schema, b)}", key in required)
                 for key, schema in props.items()]
        params = sequence(items, "", b, "params")
        return f'"{tool.name}>\\n" {params} "</function>\\n" {b.lit("</tool_call>")}'

    def _value(self, schema, b) -> str:
        end = json.dumps(self._END)
        if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and _is_text(schema):
            return f"{alternatives([json.dumps(v) for v in schema['enum']])} {end}"
        if _is_text(schema):
            return b.upto(self._END, int(schema.get("minLength", 0)), schema.get("maxLength"))
        return f"{b.json(schema if isinstance(schema, dict) else {})} {end}"

    def read(self, text, tools):
        by_name, calls = {t.name: t for t in tools}, []
        found = _qwen_calls(text)
        for _, _, name, body in found:
            tool = by_name.get(name.strip())
            if tool is None:
                continue
            props = tool.parameters.get("properties") or {}
            args = {}
            for key, raw in _qwen_parameters(body):
                key = key.strip()
                args[key] = _typed(props.get(key), raw)
            calls.append((tool.name, args))
        return (_unfinished_cut(_cut(text, found)).strip() if calls else text), calls


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null", float: "number"}


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return _JSON_TYPES.get(type(value), "")


def _schema_types(schema) -> set[str]:
    """The JSON types a parameter's schema allows ({} for a schema that names none)."""
    if not isinstance(schema, dict):
        return set()
    kinds = schema.get("type")
    out = {kinds} if isinstance(kinds, str) else {k for k in kinds if isinstance(k, str)} if isinstance(kinds, list) \
        else set()
    if isinstance(schema.get("enum"), list):
        out |= {_json_type(v) for v in schema["enum"]}
    for key in ("anyOf", "oneOf"):
        for member in schema.get(key) if isinstance(schema.get(key), list) else ():
            out |= _schema_types(member)
    return out


def _typed(schema, raw: str):
    """A qwen_xml parameter's value as its schema types it: written as it is where only a string fits; as JSON
    where that gives a value of an allowed type (`null` for ["string", "null"], `42` for ["string", "integer"],
    `{"a": 1}` for ["string", "object"]); else the text (where a string fits) or whatever JSON it is."""
    kinds = _schema_types(schema)
    if kinds == {"string"}:
        return raw
    value = loads_or(raw, raw)
    if value is raw:
        return raw
    fits = _json_type(value) in kinds or (_json_type(value) == "integer" and "number" in kinds)
    return value if fits or "string" not in kinds else raw


def _call_close(text: str, at: int) -> int:
    """Where a call whose `</function>` is at `at` ends: after whitespace and `</tool_call>`, or at the answer's
    end (an answer stopped at the closer); -1 where something else follows."""
    after = _space_end(text, at + len("</function>"))
    if text.startswith("</tool_call>", after):
        return after + len("</tool_call>")
    return after if after == len(text) else -1


def _qwen_calls(text: str) -> list[tuple[int, int, str, str]]:
    """[(start, end, name, body)], what `(?:<tool_call>\\s*)?<function=([^>\\n]+)>(.*?)</function>\\s*
    (?:</tool_call>|$)` (re.S) found: `<function=NAME>` (after `<tool_call>` and whitespace, or alone: Qwen3-Coder's
    models leave the opener out, as llama.cpp's tests note), then the body up to the first `</function>` that ends
    the call (_call_close). Each search goes on from where the last stopped (_Ahead), so openers with no end after
    them cost one search, not one each; the look back for `<tool_call>` crosses only the whitespace before this
    `<function=`."""
    gt, newline = _Ahead(lambda i: text.find(">", i)), _Ahead(lambda i: text.find("\n", i))

    def closing(i):  # the first `</function>` from i that ends a call
        while (i := text.find("</function>", i)) >= 0 and _call_close(text, i) < 0:
            i += len("</function>")
        return i

    function_end, spans, at = _Ahead(closing), [], 0
    while (head := text.find("<function=", at)) >= 0:
        at = name_at = head + len("<function=")
        name_end = _name_end(gt, newline, name_at)
        body_end = function_end(name_end + 1) if name_end >= 0 else -1
        if body_end < 0:
            continue
        start, back = head, head
        while back > (spans[-1][1] if spans else 0) and text[back - 1].isspace():
            back -= 1
        if back - len("<tool_call>") >= (spans[-1][1] if spans else 0) and text.startswith("<tool_call>",
                                                                                          back - len("<tool_call>")):
            start = back - len("<tool_call>")
        at = _call_close(text, body_end)
        spans.append((start, at, text[name_at:name_end], text[name_end + 1:body_end]))
    return spans


def _qwen_parameters(body: str) -> list[tuple[str, str]]:
    """[(key, value)], what `<parameter=([^>\\n]+)>\\n?(.*?)\\n?</parameter>` (re.S) found: the key up to the
    first `>` (no newline in it), the value up to the first `</parameter>`, less a newline at either end."""
    gt, newline = _Ahead(lambda i: body.find(">", i)), _Ahead(lambda i: body.find("\n", i))
    closer, out, at = _Ahead(lambda i: body.find("</parameter>", i)), [], 0
    while (start := body.find("<parameter=", at)) >= 0:
        at = start + len("<parameter=")
        key_end = _name_end(gt, newline, at)
        if key_end < 0:
            continue
        value_at = key_end + 1 + body.startswith("\n", key_end + 1)
        end = closer(value_at)
        if end < 0:
            continue
        value = body[value_at:end]
        out.append((body[at:key_end], value[:-1] if value.endswith("\n") else value))
        at = end + len("</parameter>")
    return out


class Llama3(ToolFormat):
    name, several = "llama3", False
    _TAG = "<|python_tag|>"

    def matches(self, template):
        return '"parameters": ' in template and ("ipython" in template or "<|python_tag|>" in template)

    def call(self, tool, b):
        return b.json(call_object(tool, "parameters"))

    def auto_grammar(self, tools, parallel, b, open_thought=False, thinks=False):
        """The answer is prose (not starting with a brace) or one call."""
        return b.grammar(f"/([^{{](.|\\n)*)?/ | {self._calls(tools, False, b)}")

    def read(self, text, tools):
        body = text.strip()
        body = body[len(self._TAG):].strip() if body.startswith(self._TAG) else body
        value = loads_or(body) if body.startswith("{") else None
        if isinstance(value, dict) and value.get("name") in {t.name for t in tools}:
            args = value.get("parameters", value.get("arguments"))
            if isinstance(args, dict):
                return "", [(value["name"], args)]
        return text, []


class Gemma4(ToolFormat):
    name, opener = "gemma4", gemma_values.CALL_OPEN
    thought = reasoning.GEMMA_CHANNEL
    stops = ("<|tool_response>",)  # after its calls Gemma 4 opens the result: the caller's to write

    def matches(self, template):
        return "<|tool_call>call:" in template

    def preamble(self, b, open_thought, thinks=False):
        return f"({b.lit('<|channel>')} {b.upto('<channel|>')})?"

    def thought_opener(self, thinks):
        return "<|channel>"

    def body(self, tool, b):
        args = gemma_values.arguments_lark(tool.parameters, b)
        return f'"call:{tool.name}{{" {args} "}}" {b.lit(gemma_values.CALL_CLOSE)}'

    def read(self, text, tools):
        names, calls = {t.name for t in tools}, []
        for _, _, name, body in _gemma_calls(text):
            try:
                args = gemma_values.parse_arguments(body)
            except (ValueError, RecursionError):  # RecursionError: brackets nested past the parser's limit
                continue
            if name in names:
                calls.append((name, args))
        content = text.split("<|tool_response>")[0]  # the thought went before (ToolFormat.answer)
        return (_cut(content, _gemma_calls(content)).strip() if calls else content), calls

    def history(self, messages, template=None):
        """The published template takes OpenAI's tool messages as they are (it finds each result's function by
        its tool_call_id, as transformers and llama.cpp hand them over). One that does not (Gemma 4's first
        "interleaved" template) takes results inside the model's turn that made the calls (`tool_responses`), and
        the answer that follows them too: the template closes that turn only after them."""
        if template and "tool_call_id" in template:
            return objects_history(messages)
        out, names = [], {}
        for m in objects_history(messages):
            if m.get("role") == "tool":
                if not out or not out[-1].get("tool_calls"):
                    out.append({"role": "user", "content": m["content"]})  # a result with no call before it
                    continue
                response = object_arguments(m["content"])
                out[-1].setdefault("tool_responses", []).append({
                    "name": names.get(m.get("tool_call_id"), m.get("name") or "unknown"),
                    "response": response if isinstance(response, dict) else m["content"]})
            elif m.get("role") == "assistant" and out and out[-1].get("tool_responses") \
                    and not out[-1]["content"] and not m.get("tool_calls"):
                out[-1]["content"] = m["content"]
            else:
                for c in m.get("tool_calls") or ():
                    names[c.get("id")] = c["function"]["name"]
                out.append(m)
        return out


_GEMMA_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _gemma_calls(text: str) -> list[tuple[int, int, str, str]]:
    """[(start, end, name, body)], what `<\\|tool_call>call:([A-Za-z0-9_-]+)\\{(.*?)\\}<tool_call\\|>` (re.S)
    found: the opener and `call:`, a name, `{`, the body up to the first `}` + closer after it."""
    opener, closer = gemma_values.CALL_OPEN + "call:", "}" + gemma_values.CALL_CLOSE
    close, spans, at = _Ahead(lambda i: text.find(closer, i)), [], 0
    while (start := text.find(opener, at)) >= 0:
        at = name_end = start + len(opener)
        while name_end < len(text) and text[name_end] in _GEMMA_NAME:
            name_end += 1
        end = close(name_end + 1) if name_end > at and text.startswith("{", name_end) else -1
        if end >= 0:
            spans.append((start, end + len(closer), text[at:name_end], text[name_end + 1:end]))
            at = end + len(closer)
    return spans


class Harmony(ToolFormat):
    name, several = "harmony", False

    def history(self, messages, template=None):
        """gpt-oss's template reads an earlier turn's reasoning as `thinking` (OpenAI clients send it back as
        reasoning_content)."""
        return [{**m, "thinking": m["reasoning_content"]} if m.get("reasoning_content") else m
                for m in objects_history(messages)]

    def matches(self, template):
        return "<|call|>" in template and "functions." in template

    def preamble(self, b, open_thought, thinks=False):
        return (f"({b.lit('<|channel|>')} \"analysis\" {b.lit('<|message|>')} {b.upto('<|end|>')} "
                f"{b.lit('<|start|>')} \"assistant\")?")

    def call(self, tool, b):
        return (f'{b.lit("<|channel|>")} "commentary to=functions.{tool.name} " {b.lit("<|constrain|>")} "json" '
                f'{b.lit("<|message|>")} {b.json(tool.parameters)}')

    def answer(self, text, tools, thought=None, open_thought=False):
        """gpt-oss's channels (runtime/harmony.py): analysis is the reasoning, final and commentary the content, a
        message to `functions.NAME` a call (from whichever channel: its arguments are not reasoning), one to a
        built-in tool (`browser.search`, `python`, `container.exec`) neither."""
        from specrt.runtime.harmony import HarmonyParser

        parser = HarmonyParser(in_header=True)
        pieces = parser.feed(text) + parser.finish()
        if not pieces and "<|message|>" not in text:  # an answer in no message at all: the text is the content
            return Answer(text, "", [])
        names, calls = {t.name for t in tools}, []
        for p in pieces:
            args = loads_or(p.text) if p.kind == "call" else None
            if p.recipient is not None and p.recipient[len("functions."):] in names and isinstance(args, dict):
                calls.append((p.recipient[len("functions."):], args))
        return Answer("".join(p.text for p in pieces if p.content), "".join(p.text for p in pieces if p.reasoning),
                      calls)

    def read(self, text, tools):
        said = self.answer(text, tools)
        return said.content, said.calls


# the order a template is tried in: the more specific markers first
FORMATS = {f.name: f for f in (Harmony(), Gemma4(), QwenXml(), Hermes(), Llama3())}
