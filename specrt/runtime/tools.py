"""Tool calls: OpenAI's `tools` / `tool_choice` through the chat template's own tool format, or a generic one.

Formats:
- the template's own, where it has one (runtime/tool_formats.py: hermes for Qwen2.5/Qwen3, qwen_xml for
  Qwen3.5/3.6, llama3, gemma4, harmony for gpt-oss): the tools go to the template's `tools` variable, earlier calls
  and results go back as the template takes them, calls are read out of the answer in that format.
- generic, for a template with no tool format (the default model's), as llama.cpp's server does it: the tools are
  described in a system message and the answer is one JSON object, `{"tool_call": {"name": ..., "arguments":
  {...}}}` (`{"tool_calls": [...]}` with parallel calls) or `{"response": "..."}`, constrained to that schema.

tool_choice: `none` (the tools are not shown; plain text), `auto` (the model decides: in the template's format the
answer is free until the format's call opener and only well-formed calls after it, harmony's is read as it comes; a
generic one is constrained to a call or a response), `required` or a named function
(the answer is constrained to calls, of that function only when named, in the template's format: its markers by
the vocabulary's special tokens, reasoning first where the prompt leaves a thought open). A call's arguments fit
the tool's parameters schema wherever the answer is constrained; calls read from a free answer are kept only if
they parse and name a given tool.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from dataclasses import dataclass

from specrt.errors import SpecrtError
from specrt.runtime.harmony import partial_marker
from specrt.runtime.reasoning import THINK, ThoughtStyle, split as split_thought, style_of
from specrt.runtime.tool_formats import Answer, call_object, loads_or, object_arguments

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: `^...$` with match let a trailing newline through
CHOICES = ("none", "auto", "required")


class ToolError(SpecrtError):
    """Tools or a tool_choice that cannot be used (named in one line; the server answers 400)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of the arguments object
    spec: dict  # the OpenAI tool as given ({"type": "function", "function": {...}})


def parse_tools(tools) -> list[Tool]:
    """OpenAI's tools list, checked: function names, parameter schemas the grammar engine compiles."""
    from specrt.runtime.constraint import ConstraintError, OutputConstraint

    if not isinstance(tools, list) or not tools:
        raise ToolError("'tools' must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    out, names = [], set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -, got {name!r}")
        if name in names:
            raise ToolError(f"tools[{i}].function.name {name!r} is given twice")
        names.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
        try:
            OutputConstraint.grammar_for({"type": "json_schema", "json_schema": {"schema": params}})
        except ConstraintError as exc:
            raise ToolError(f"tools[{i}].function.parameters: {exc}") from None
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise ToolError(f"tools[{i}].function.description must be a string")
        out.append(Tool(name, description, params, {"type": "function", "function": {
            "name": name, "description": description, "parameters": params}}))
    return out


def parse_choice(choice, tools: list[Tool]) -> tuple[str, str | None]:
    """tool_choice -> (none | auto | required, the named function or None)."""
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolError(f"tool_choice must be none, auto, required or {{\"type\": \"function\", ...}}, got "
                            f"{choice!r}")
        return choice, None
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(choice.get("function"), dict) else None
    if not isinstance(name, str):
        raise ToolError("tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}")
    if name not in {t.name for t in tools}:
        raise ToolError(f"tool_choice names the function {name!r}, which is not among the tools "
                        f"({', '.join(t.name for t in tools)})")
    return "required", name


def template_format(template_source: str | None) -> str:
    """The chat template's own tool format (runtime/tool_formats.py), or generic where it has none."""
    from specrt.runtime.tool_detection import format_of

    return format_of(template_source)


def _call_schema(tools: list[Tool], only: str | None) -> dict:
    from specrt.runtime.constraint import JSON_LAYOUT

    calls = [call_object(t) for t in tools if only is None or t.name == only]
    return {"anyOf": calls, "x-guidance": JSON_LAYOUT} if len(calls) > 1 else {**calls[0], "x-guidance": JSON_LAYOUT}


@dataclass(frozen=True)
class ToolPlan:
    """How one request with tools is run: the messages to render, template variables, the output grammar (None:
    free text) and the format its output is read in."""
    messages: list[dict]
    variables: dict
    grammar: str | None
    format: str
    mode: str  # none | auto | required
    tools: tuple[Tool, ...]
    only: str | None = None  # the function a named tool_choice asks for
    parallel: bool = True
    thought: ThoughtStyle | None = None  # the template's thought markers (runtime/reasoning.py)

    @property
    def stops(self) -> tuple[str, ...]:
        """Stop strings the format adds (runtime/tool_formats.py ToolFormat.stops)."""
        from specrt.runtime.tool_formats import FORMATS

        return FORMATS[self.format].stops if self.mode != "none" and self.format in FORMATS else ()

    @property
    def native_grammar(self) -> bool:
        """The answer is constrained in the template's own format (calls when required, calls after free text when
        auto): its grammar is built with the vocabulary's special tokens and the prompt's end (call_grammar)."""
        return self.mode in ("required", "auto") and self.format != "generic"


def call_grammar(p: ToolPlan, special_id, open_thought: bool) -> str | None:
    """The grammar of the answer (plan.native_grammar). required / named: reasoning where the prompt leaves a
    thought open, then one call (several where allowed) of the given tools, of the named one only when named. auto:
    free text, and once the format's call opener is written, only well-formed calls (None for a format without an
    opener: harmony's answer is read as it comes)."""
    from specrt.runtime.constraint import _llguidance
    from specrt.runtime.tool_formats import FORMATS
    from specrt.runtime.tool_grammar import LarkBuilder

    tools = [t for t in p.tools if p.only is None or t.name == p.only]
    fmt, b = FORMATS[p.format], LarkBuilder(special_id)
    thinks = p.thought is not None and p.thought.open == THINK.open  # the model may open a <think> itself
    lark = fmt.grammar(tools, p.parallel, b, open_thought, thinks) if p.mode == "required" else \
        fmt.auto_grammar(tools, p.parallel, b, open_thought, thinks)
    return None if lark is None else _llguidance().LLMatcher.grammar_from_lark(lark)


def plan(messages: list[dict], tools: list[Tool], mode: str, only: str | None, parallel: bool, fmt: str,
         template: str | None = None) -> ToolPlan:
    """The request's rendering and constraint (see the module docstring); template: the chat template's source
    (how it takes results, which thought markers it writes)."""
    thought = style_of(template)
    if mode == "none":
        return ToolPlan(_plain_history(messages, fmt, template), {}, None, fmt, mode, tuple(tools), only, parallel,
                        thought)
    if fmt != "generic":  # the template lists the tools; the answer's grammar is built with the prompt
        from specrt.runtime.tool_formats import FORMATS

        return ToolPlan(FORMATS[fmt].history(messages, template), {"tools": [t.spec for t in tools]}, None, fmt,
                        mode, tuple(tools), only, parallel, thought)
    from specrt.runtime.constraint import _llguidance

    llguidance = _llguidance()
    call = _call_schema(tools, only)
    from specrt.runtime.constraint import JSON_LAYOUT

    calls = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
             "required": ["tool_calls"], "additionalProperties": False} if parallel else \
        {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"], "additionalProperties": False}
    answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
              "additionalProperties": False}
    schema = {"anyOf": [calls, answer]} if mode == "auto" else calls
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({**schema, "x-guidance": JSON_LAYOUT}))
    return ToolPlan(_generic_history(messages, tools, mode, parallel), {}, grammar, fmt, mode, tuple(tools),
                    only, parallel, thought)


def _plain_history(messages: list[dict], fmt: str, template: str | None) -> list[dict]:
    """Tools not shown: earlier calls and results as the template's own format writes them, or as text."""
    from specrt.runtime.tool_formats import FORMATS

    return FORMATS[fmt].history(messages, template) if fmt in FORMATS else _generic_turns(messages)


def _generic_turns(messages: list[dict]) -> list[dict]:
    """Earlier calls as the assistant's JSON, tool results as user turns (templates without a tool role)."""
    out = []
    for m in messages:
        if m.get("role") == "tool":
            out.append({"role": "user", "content": json.dumps({"tool_result": {
                "tool_call_id": m.get("tool_call_id"), "content": m.get("content") or ""}}, ensure_ascii=False)})
        elif m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": object_arguments(c["function"]["arguments"])}
                     for c in m["tool_calls"]]
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def _generic_history(messages: list[dict], tools: list[Tool], mode: str, parallel: bool) -> list[dict]:
    listed = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                  ensure_ascii=False) for t in tools)
    shape = '{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}' if parallel else \
        '{"tool_call": {"name": ..., "arguments": {...}}}'
    how = f"Answer with one JSON object: {shape} to call a tool"
    how += ', or {"response": "..."} to answer directly.' if mode == "auto" else "."
    note = f"You can call these tools:\n{listed}\n{how}"
    turns = _generic_turns(messages)
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": turns[0]["content"] + "\n\n" + note}] + turns[1:]
    return [{"role": "system", "content": note}] + turns


def _call(name: str, arguments) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def read_answer(text: str, p: ToolPlan, open_thought: bool = False, inline: bool = False) -> Answer:
    """The generated text -> Answer(content, reasoning, calls in OpenAI's form); open_thought: the prompt left the
    thought open (the text starts inside it); inline: the thought stays in the content, markers and all (llama.cpp's
    reasoning_format none), the prompt's open thought marker put back before it."""
    if inline:
        if p.format == "harmony":
            from specrt.runtime.harmony import inline as harmony_inline

            return Answer(harmony_inline(text), "", read_answer(text, p).calls)
        if open_thought and p.thought is not None:
            text = p.thought.open + "\n" + text
        if p.format != "generic" and p.mode != "none":
            from specrt.runtime.tool_formats import FORMATS

            content, found = FORMATS[p.format].read(text, p.tools)
            return Answer(content, "", [_call(name, args) for name, args in found])
        p = dataclasses.replace(p, thought=None)
    if p.format != "generic" and p.mode != "none":
        from specrt.runtime.tool_formats import FORMATS

        said = FORMATS[p.format].answer(text, p.tools, p.thought, open_thought)
        return Answer(said.content, said.reasoning, [_call(name, args) for name, args in said.calls])
    if p.format == "harmony":  # tool_choice none: the channels, no calls
        from specrt.runtime.tool_formats import FORMATS

        said = FORMATS["harmony"].answer(text, (), None, False)
        return Answer(said.content, said.reasoning, [])
    thought, text = split_thought(text, p.thought, open_thought)
    if p.mode == "none":
        return Answer(text, thought, [])
    names = {t.name for t in p.tools}
    value = loads_or(text)  # None where cut short (max_tokens) or nested past the parser: the text is content
    if not isinstance(value, dict):
        return Answer(text, thought, [])
    if "response" in value:
        return Answer(value["response"], thought, [])
    raw = value.get("tool_calls") or ([value["tool_call"]] if "tool_call" in value else [])
    calls = [_call(c["name"], c["arguments"]) for c in raw if isinstance(c, dict) and c.get("name") in names]
    return Answer("" if calls else text, thought, calls)


def read_output(text: str, p: ToolPlan, open_thought: bool = False) -> tuple[str | None, list[dict]]:
    """The generated text -> (content or None, tool calls in OpenAI's form); the thought is read_answer's."""
    said = read_answer(text, p, open_thought)
    return (said.content or None), said.calls


class CallContent:
    """Streams an answer's content while the model may still call a tool: text is let out up to where a call could
    begin (`opener`, the format's; a held-back tail that may be its start), nothing after one begins; if the answer
    then holds no call that parses, the rest goes out at its end."""

    def __init__(self, openers: tuple[str, ...] = ("<tool_call>",)):
        self.openers = (openers,) if isinstance(openers, str) else tuple(openers)
        self.text, self.sent, self.calling = "", 0, False

    def feed(self, chunk: str) -> str:
        self.text += chunk
        if self.calling:
            return ""
        at = min((i for o in self.openers if (i := self.text.find(o, self.sent)) >= 0), default=-1)
        if at >= 0:
            self.calling = True
            end = at
        else:  # hold back a tail that may be the start of an opener
            end = len(self.text) - partial_marker(self.text, self.openers, within=len(self.text) - self.sent)
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self, called: bool) -> str:
        """What is left to send once the answer has ended: nothing when it made calls."""
        out, self.sent = ("" if called else self.text[self.sent:]), len(self.text)
        return out


def streamed_content(fmt: str) -> CallContent | None:
    """For tool_choice auto under a format whose calls open with a marker: the content streamer; None where the
    answer is read once it ends (generic JSON, llama3's whole-answer JSON, harmony)."""
    from specrt.runtime.tool_formats import FORMATS

    f = FORMATS.get(fmt)
    return CallContent(f.openers or (f.opener,)) if f is not None and f.opener else None
